// Python's state in and out: the pickle reader on what Python's pickler writes (NumPy arrays and
// scalars, protocol 2's bytes, OrderedDicts, sets) and on what it must refuse; optimizers and
// schedulers restored from Python's layout exactly, and refused with a sentence naming the part
// when the layout is another type's; NumPy's and Python's generators seeded as Determined seeds them;
// LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR,
// CosineAnnealingWarmRestarts, OneCycleLR, CyclicLR, SequentialLR and ChainedScheduler against the
// learning rates, momenta and state dicts Python computes (tests/python/scheduler_reference.py prints them).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <dettrial/dettrial.hpp>

using namespace dettrial;

namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// pickle.dumps(OrderedDict(a=np.array([1, 4000000000, 7], uint32), b=b"\x00\xffhi",
//   c=(1, -2, 2**40, -2**40, 1.5, None, True), d={3: "x"}, e=np.float64(0.25),
//   f=np.array([[1.5, 2.5], [3.5, 4.5]], float32), g={1, 2}), protocol=P), NumPy 2.
const char* const protocol2 =
    "800263636f6c6c656374696f6e730a4f726465726564446963740a710029527101285801000000617102636e756d70792e5f636f72652e6d756c746961727261"
    "790a5f7265636f6e7374727563740a7103636e756d70790a6e6461727261790a71044b00857105635f636f646563730a656e636f64650a710658010000006271"
    "0758060000006c6174696e31710886710952710a87710b52710c284b014b0385710d636e756d70790a64747970650a710e58020000007534710f898887711052"
    "7111284b0358010000003c71124e4e4e4affffffff4affffffff4b0074711362896806580d0000000100000000286bc3ae070000007114680886711552711674"
    "71176258010000006271186806580500000000c3bf68697119680886711a52711b580100000063711c284b014afeffffff8a060000000000018a060000000000"
    "ff473ff80000000000004e8874711d580100000064711e7d711f4b035801000000787120735801000000657121636e756d70792e5f636f72652e6d756c746961"
    "727261790a7363616c61720a7122680e5802000000663871238988877124527125284b0368124e4e4e4affffffff4affffffff4b007471266268065809000000"
    "000000000000c3903f7127680886712852712986712a52712b580100000066712c680368044b0085712d680a87712e52712f284b014b024b02867130680e5802"
    "000000663471318988877132527133284b0368124e4e4e4affffffff4affffffff4b007471346289680658120000000000c3803f00002040000060400000c290"
    "4071356808867136527137747138625801000000677139635f5f6275696c74696e5f5f0a7365740a713a5d713b284b014b026585713c52713d752e";
const char* const protocol4 =
    "800495a3010000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c0161948c166e756d70792e5f636f72652e6d"
    "756c74696172726179948c0c5f7265636f6e7374727563749493948c056e756d7079948c076e6461727261799493944b0085944301629487945294284b014b03"
    "859468088c0564747970659493948c02753494898887945294284b038c013c944e4e4e4affffffff4affffffff4b0074946289430c0100000000286bee070000"
    "00947494628c016294430400ff6869948c016394284b014afeffffff8a060000000000018a060000000000ff473ff80000000000004e8874948c0164947d944b"
    "038c017894738c01659468058c067363616c617294939468118c02663894898887945294284b0368154e4e4e4affffffff4affffffff4b007494624308000000"
    "000000d03f94869452948c0166946807680a4b008594680c87945294284b014b024b02869468118c02663494898887945294284b0368154e4e4e4affffffff4a"
    "ffffffff4b007494628943100000c03f000020400000604000009040947494628c0167948f94284b014b0290752e";
// pickle.dumps({"a": np.array([5, 6], int64)}, protocol=2) with NumPy 1 (numpy.core.multiarray).
const char* const numpy1 =
    "80027d71005801000000617101636e756d70792e636f72652e6d756c746961727261790a5f7265636f6e7374727563740a7102636e756d70790a6e6461727261"
    "790a71034b00857104635f636f646563730a656e636f64650a7105580100000062710658060000006c6174696e31710786710852710987710a52710b284b014b"
    "0285710c636e756d70790a64747970650a710d58020000006938710e898887710f527110284b0358010000003c71114e4e4e4affffffff4affffffff4b007471"
    "12628968055810000000050000000000000006000000000000007113680786711452711574711662732e";

torch::nn::Sequential small_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(5, 4), torch::nn::Tanh(), torch::nn::Linear(4, 2));
}

/// Sets the same gradients on both models' parameters (a fixed function of the step).
void set_grads(torch::nn::Sequential& a, torch::nn::Sequential& b, int step) {
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const torch::Tensor g = torch::sin(torch::arange(pa[i].numel(), torch::kFloat).add(static_cast<double>(step + 7 * i))).view_as(pa[i]);
    pa[i].mutable_grad() = g.clone();
    pb[i].mutable_grad() = g.clone();
  }
}

/// Trains with `make`'s optimizer for 3 steps, moves its Python-layout state through a torch.save
/// archive into a fresh optimizer over a copy of the model, and steps both 3 more times: the
/// parameters must stay bit-equal.
template <class Make>
void check_round_trip(Make make) {
  torch::nn::Sequential a = small_model(), b = small_model();
  auto first = make(a->parameters());
  torch::nn::Sequential other = small_model();
  for (int s = 0; s < 3; ++s) {
    set_grads(a, other, s);
    first.step();
  }
  {
    torch::NoGradGuard no_grad;
    auto pa = a->parameters(), pb = b->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  auto second = make(b->parameters());
  const StateDict saved =
      dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(optimizer_state_dict(first)), "round trip").toGenericDict();
  load_optimizer_state_dict(second, saved, "the optimizer");
  for (int s = 3; s < 6; ++s) {
    set_grads(a, b, s);
    first.step();
    second.step();
  }
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
}

}  // namespace

TEST_CASE("python pickle: NumPy arrays and scalars, protocol 2 bytes, OrderedDicts, sets and big integers read as Python wrote them") {
  for (const char* hex : {protocol2, protocol4}) {
    const c10::IValue v = dettrial::detail::unpickle(from_hex(hex));
    REQUIRE(v.isGenericDict());
    const auto d = v.toGenericDict();
    const torch::Tensor a = d.at("a").toTensor();
    CHECK((a.scalar_type() == torch::kLong));  // uint32, widened
    CHECK((a.dim() == 1 && a.size(0) == 3));
    CHECK(a[1].item<std::int64_t>() == 4000000000LL);
    CHECK(d.at("b").toStringRef() == std::string("\x00\xffhi", 4));
    const auto c = d.at("c").toTupleRef().elements();
    CHECK(c[1].toInt() == -2);
    CHECK(c[2].toInt() == (std::int64_t{1} << 40));
    CHECK(c[3].toInt() == -(std::int64_t{1} << 40));
    CHECK(c[4].toDouble() == 1.5);
    CHECK(c[5].isNone());
    CHECK(c[6].toBool());
    CHECK(d.at("d").toGenericDict().at(3).toStringRef() == "x");
    CHECK(d.at("e").toDouble() == 0.25);
    const torch::Tensor f = d.at("f").toTensor();
    CHECK((f.dim() == 2 && f.size(0) == 2 && f.size(1) == 2));
    CHECK(f[1][0].item<float>() == 3.5F);
    CHECK(d.at("g").toList().size() == 2);
  }
  const c10::IValue old = dettrial::detail::unpickle(from_hex(numpy1));
  CHECK(old.toGenericDict().at("a").toTensor()[1].item<std::int64_t>() == 6);
}

TEST_CASE("python pickle: a truncated pickle and an unknown global are refused by name, and nothing is run") {
  const std::string whole = from_hex(protocol2);
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(whole.substr(0, whole.size() / 2)), doctest::Contains("ends"), std::runtime_error);
  // GLOBAL os.system, then ("echo",) REDUCE: what a malicious pickle does.
  const std::string attack = std::string("\x80\x02") + "cos\nsystem\nX\x04" + std::string(3, '\0') + "echo" + "\x85" + "R.";
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(attack), doctest::Contains("'os.system', which dettrial does not read"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(std::string("\x80\x02\xff", 3)), doctest::Contains("opcode 0xff"), std::runtime_error);
}

TEST_CASE("python pickle: every truncation and thousands of byte changes of a real pickle are read or refused, never a crash") {
  const std::string whole = from_hex(protocol4);
  std::size_t refused = 0;
  const auto attempt = [&](const std::string& bytes) {
    try {
      (void)dettrial::detail::unpickle(bytes);
    } catch (const std::exception&) {
      ++refused;
    }
  };
  for (std::size_t n = 0; n < whole.size(); ++n) attempt(whole.substr(0, n));
  CHECK(refused == whole.size());  // every proper prefix lacks its STOP
  std::mt19937 random(7);
  for (int i = 0; i < 5000; ++i) {
    std::string changed = whole;
    changed[random() % changed.size()] = static_cast<char>(random() & 0xff);
    attempt(changed);
  }
}

/// `archive` written again with the element count of the first tensor storage of its pickle (4,
/// pickled as BININT1 `K\x04`) replaced by `count`, an opcode and its argument, and its storages
/// as they were: a well-formed archive whose pickle asks for more than a record holds.
std::string with_storage_count(const std::string& archive, const std::string& count) {
  std::istringstream in(archive);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  auto [pickled, pickled_size] = reader.getRecord("data.pkl");
  std::string pickle(static_cast<const char*>(pickled.get()), pickled_size);
  // The storage's persistent id ends ('cpu', 4): its element count follows the device.
  const auto device = pickle.find("cpu");
  REQUIRE(device != std::string::npos);
  const auto at = pickle.find(std::string("K\x04", 2), device);
  REQUIRE(at != std::string::npos);
  pickle.replace(at, 2, count);
  std::string crafted;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, std::size_t n) {
    crafted.append(static_cast<const char*>(data), n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const std::string& record : reader.getAllRecords()) {
    if (record.rfind("data/", 0) != 0) continue;
    auto [storage, storage_size] = reader.getRecord(record);
    writer.writeRecord(record, storage.get(), storage_size);
  }
  writer.writeEndOfFile();
  return crafted;
}

TEST_CASE("python pickle: a storage whose pickle asks for more elements than its record holds is refused before any allocation") {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("w", torch::ones({4}));
  const std::string whole = dettrial::detail::pickle_archive(d);
  // The count 4, as BININT1, becomes 2**40 as LONG1 (4 TiB of floats, which an allocation made
  // first would fail on, with another message).
  const std::string crafted = with_storage_count(whole, std::string("\x8a\x06\x00\x00\x00\x00\x00\x01", 8));
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle_archive(crafted, "crafted.pth"),
                       doctest::Contains("tensor storage '0' holds 16 bytes where 1099511627776 of 4 bytes are needed"), CheckpointError);
  // The file as written reads back.
  CHECK(dettrial::detail::unpickle_archive(whole, "written.pth").toGenericDict().at("w").toTensor().equal(torch::ones({4})));
}

// torch 2.15's MultiStepLR(milestones=[3, 5, 5], gamma=0.5).state_dict() after 6 steps, as
// pickle.dumps(state, protocol=2) writes it: its milestones are a collections.Counter.
const char* const multistep_state =
    "80027d710028580a0000006d696c6573746f6e6573710163636f6c6c656374696f6e730a436f756e7465720a71027d7103284b034b014b054b02758571045271"
    "05580500000067616d6d617106473fe00000000000005808000000626173655f6c727371075d7108473fb999999999999a61580a0000006c6173745f65706f"
    "636871094b06580b0000005f737465705f636f756e74710a4b07580b0000005f69735f696e697469616c710b89581a0000005f6765745f6c725f63616c6c"
    "65645f77697468696e5f73746570710c8958080000005f6c6173745f6c72710d5d710e473f8999999999999a61752e";
// pickle.dumps({"d": collections.defaultdict(list, {1: [2, 3]}), "t": datetime.date(2020, 1, 2)}, protocol=2).
const char* const defaultdict_and_date =
    "80027d710028580100000064710163636f6c6c656374696f6e730a64656661756c74646963740a7102635f5f6275696c74696e5f5f0a6c69737"
    "40a71038571045271054b015d7106284b024b0365735801000000747107636461746574696d650a646174650a7108635f636f646563730a656e63"
    "6f64650a7109580500000007c3a40102710a58060000006c6174696e31710b86710c52710d85710e52710f752e";

TEST_CASE("python pickle: MultiStepLR's state as Python pickles it (a Counter) loads, and a defaultdict reads as a dict") {
  const c10::IValue state = dettrial::detail::unpickle(from_hex(multistep_state));
  torch::nn::Sequential model = small_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  optim::MultiStepLR scheduler(sgd, {1}, 0.9);
  scheduler.load_python_state(state.toGenericDict(), "LR scheduler 0");
  CHECK(scheduler.milestones() == std::map<std::int64_t, std::int64_t>{{3, 1}, {5, 2}});
  CHECK(scheduler.last_epoch() == 6);
  CHECK(scheduler.get_last_lr() == std::vector<double>{0.0125});

  // An object of a type dettrial does not read: refused by name, or (for a checkpoint's parts) kept
  // as a marker whose type python_object_type names.
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(from_hex(defaultdict_and_date)),
                       doctest::Contains("a Python object of type 'datetime.date', which dettrial does not read"), std::runtime_error);
  const c10::IValue marked = dettrial::detail::unpickle(from_hex(defaultdict_and_date), {}, dettrial::detail::UnreadObjects::mark);
  const auto d = marked.toGenericDict().at("d").toGenericDict();
  CHECK(d.at(1).toList().size() == 2);
  CHECK(dettrial::detail::python_object_type(marked) == std::optional<std::string>("datetime.date"));
  CHECK(dettrial::detail::python_object_type(marked.toGenericDict().at("d")) == std::nullopt);
}

TEST_CASE("python state: each optimizer comes back exactly from Python's layout, and trains on bit for bit") {
  using namespace torch::optim;
  SUBCASE("SGD with momentum and Nesterov") {
    check_round_trip([](std::vector<torch::Tensor> p) { return SGD(p, SGDOptions(0.1).momentum(0.9).nesterov(true)); });
  }
  SUBCASE("the fused SGD") {
    check_round_trip([](std::vector<torch::Tensor> p) { return optim::FusedSGD(p, SGDOptions(0.1).momentum(0.9)); });
  }
  SUBCASE("Adam") {
    check_round_trip([](std::vector<torch::Tensor> p) { return Adam(p, AdamOptions(0.01)); });
  }
  SUBCASE("the fused Adam") {
    check_round_trip([](std::vector<torch::Tensor> p) { return optim::FusedAdam(p, AdamOptions(0.01)); });
  }
  SUBCASE("AdamW with amsgrad") {
    check_round_trip([](std::vector<torch::Tensor> p) { return AdamW(p, AdamWOptions(0.01).amsgrad(true).weight_decay(0.1)); });
  }
  SUBCASE("RMSprop, centered with momentum") {
    check_round_trip([](std::vector<torch::Tensor> p) { return RMSprop(p, RMSpropOptions(0.01).momentum(0.5).centered(true)); });
  }
  SUBCASE("Adagrad") {
    check_round_trip([](std::vector<torch::Tensor> p) { return Adagrad(p, AdagradOptions(0.05)); });
  }
  SUBCASE("Adadelta") {
    check_round_trip([](std::vector<torch::Tensor> p) { return optim::Adadelta(p, optim::AdadeltaOptions(1.0)); });
  }
}

TEST_CASE("python state: an optimizer state of another type or network is refused naming the group, the option or the entry") {
  torch::nn::Sequential model = small_model();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  torch::nn::Sequential other = small_model();
  set_grads(model, other, 0);
  adam.step();
  const StateDict adam_state = optimizer_state_dict(adam);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(sgd, adam_state, "optimizer 0"),
                       doctest::Contains("optimizer 0, group 0 has option 'betas', which SGD does not have"), CheckpointError);
  CHECK(sgd.param_groups()[0].options().get_lr() == 0.1);  // nothing changed
  torch::nn::Sequential bigger(torch::nn::Linear(5, 4), torch::nn::Tanh(), torch::nn::Linear(4, 3));
  torch::optim::Adam adam2(bigger->parameters(), torch::optim::AdamOptions(0.01));
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(adam2, adam_state, "optimizer 0"),
                       doctest::Contains("parameter 2: 'exp_avg' has shape [2, 4] but the parameter [3, 4]"), CheckpointError);
  StateDict maximizing = adam_state.copy();
  auto group = maximizing.at("param_groups").toList().get(0).toGenericDict();
  group.insert_or_assign("maximize", true);
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(adam, maximizing, "optimizer 0"), doctest::Contains("maximize: True"), CheckpointError);
  // Python's AdamW (torch 2.x writes decoupled_weight_decay: True) is another update than Adam's:
  // refused by name, never trained on as Adam with L2 weight decay; and the other way round.
  StateDict adamw_state = optimizer_state_dict(adam);  // a fresh dict (copy() shares the groups)
  adamw_state.at("param_groups").toList().get(0).toGenericDict().insert_or_assign("decoupled_weight_decay", true);
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(adam, adamw_state, "optimizer 0"),
                       doctest::Contains("optimizer 0, group 0 has decoupled_weight_decay: True, which the trial's Adam does not do "
                                         "(that is AdamW's decoupled weight decay: the trial's optimizer must be torch::optim::AdamW)"),
                       CheckpointError);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.01));
  load_optimizer_state_dict(adamw, adamw_state, "optimizer 0");  // what it is for
  StateDict plain_adam = optimizer_state_dict(adam);
  plain_adam.at("param_groups").toList().get(0).toGenericDict().insert_or_assign("decoupled_weight_decay", false);
  load_optimizer_state_dict(adam, plain_adam, "optimizer 0");
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(adamw, plain_adam, "optimizer 0"),
                       doctest::Contains("has decoupled_weight_decay: False, which the trial's AdamW does not do"), CheckpointError);
}

TEST_CASE("python state: StepLR and ReduceLROnPlateau come back from Python's state dict, and another type's is refused by name") {
  torch::nn::Sequential model = small_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  optim::StepLR stepped(sgd, 3, 0.5);
  for (int i = 0; i < 7; ++i) stepped.step();
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  stepped.python_state(state);
  const auto read = dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(state), "scheduler").toGenericDict();
  torch::nn::Sequential model2 = small_model();
  torch::optim::SGD sgd2(model2->parameters(), torch::optim::SGDOptions(0.1));
  optim::StepLR fresh(sgd2, 5, 0.9);
  fresh.load_python_state(read, "LR scheduler 0");
  sgd2.param_groups()[0].options().set_lr(sgd.param_groups()[0].options().get_lr());  // the optimizer's own state carries it
  CHECK(fresh.last_epoch() == 7);
  CHECK(fresh.step_size() == 3);
  for (int i = 0; i < 5; ++i) {
    stepped.step();
    fresh.step();
    CHECK(fresh.get_last_lr() == stepped.get_last_lr());
  }
  // ReduceLROnPlateau: options and where the plateau stands.
  optim::ReduceLROnPlateau plateau(sgd, {.mode = "max", .factor = 0.5, .patience = 1, .cooldown = 1});
  for (const double metric : {0.5, 0.6, 0.6, 0.6}) plateau.step(metric);
  c10::impl::GenericDict plateau_state(c10::StringType::get(), c10::AnyType::get());
  plateau.python_state(plateau_state);
  optim::ReduceLROnPlateau plateau2(sgd2);
  plateau2.load_python_state(dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(plateau_state), "plateau").toGenericDict(),
                             "LR scheduler 1");
  sgd2.param_groups()[0].options().set_lr(sgd.param_groups()[0].options().get_lr());  // the optimizer's state carries it
  CHECK(plateau2.best() == 0.6);
  CHECK(plateau2.options().mode == "max");
  CHECK(plateau2.num_bad_epochs() == plateau.num_bad_epochs());
  CHECK(plateau2.cooldown_counter() == plateau.cooldown_counter());
  for (const double metric : {0.55, 0.55, 0.7, 0.4, 0.4}) {
    plateau.step(metric);
    plateau2.step(metric);
    CHECK(plateau2.num_bad_epochs() == plateau.num_bad_epochs());
    CHECK(plateau2.get_last_lr() == plateau.get_last_lr());
  }
  optim::MultiStepLR multi(sgd2, {2, 4});
  CHECK_THROWS_WITH_AS(multi.load_python_state(read, "LR scheduler 0"),
                       doctest::Contains("LR scheduler 0 has 'step_size', which Python's MultiStepLR does not have"), CheckpointError);
}

TEST_CASE("python state: NumPy's and Python's generators are seeded as np.random.seed and random.seed seed them") {
  // From Python: np.random.seed(17); np.random.get_state() and random.seed(17); random.getstate().
  const auto np = dettrial::detail::numpy_seeded_state(17).toTupleRef().elements();
  CHECK(np[0].toStringRef() == "MT19937");
  const auto key = np[1].toList();
  REQUIRE(key.size() == 624);
  CHECK(key.get(0).toInt() == 17);
  CHECK(key.get(1).toInt() == 746594230);
  CHECK(key.get(623).toInt() == 1147440304);
  CHECK(np[2].toInt() == 624);
  const auto py = dettrial::detail::python_random_seeded_state(17).toTupleRef().elements();
  CHECK(py[0].toInt() == 3);
  const auto words = py[1].toTupleRef().elements();
  REQUIRE(words.size() == 625);
  CHECK(words[0].toInt() == 2147483648LL);
  CHECK(words[1].toInt() == 3170634271LL);
  CHECK(words[2].toInt() == 2035982193LL);
  CHECK(words[623].toInt() == 714977695LL);
  CHECK(words[624].toInt() == 624);
  CHECK(py[2].isNone());
}

// ------------------------------------------------------------------------------------------------
// LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR and
// CosineAnnealingWarmRestarts against torch.optim.lr_scheduler.

namespace {

/// What tests/python/scheduler_reference.py prints for one configuration.
struct SchedulerReference {
  /// The Python constructor, after the optimizer.
  const char* config;
  /// The groups' learning rates before the scheduler is made.
  std::vector<double> lrs;
  /// FNV-1a of every group's rate and then every group's momentum (SGD's, or Adam's beta1 for a
  /// configuration named "Adam: ...") after 0, 1, ..., 300 step() calls.
  std::uint64_t all_rates;
  /// The rates and momenta after some numbers of calls.
  std::vector<std::pair<int, std::vector<double>>> samples;
  /// FNV-1a of the rates after 38, ..., 300 calls.
  std::uint64_t rates_after_saved;
  /// pickle.dumps(state_dict(), protocol=2) after 37 calls, or null.
  const char* state;
};
constexpr int reference_steps = 300;
constexpr int saved_at = 37;

// Printed by tests/python/scheduler_reference.py with torch 2.15.0 (its CPU arithmetic).
const std::vector<SchedulerReference>& scheduler_references() {
  // clang-format off: as the script prints it
  static const std::vector<SchedulerReference> references = {
    {"LinearLR(start_factor=0.25, end_factor=0.9, total_iters=40)", {0.1, 0.025}, 0x2458d56ac9a0ea1dULL,
     {{0, {0x1.999999999999ap-6, 0x1.999999999999ap-8, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.b4395810624ddp-6, 0x1.b4395810624ddp-8, 0x0.0p+0, 0x0.0p+0}}, {2, {0x1.ced916872b021p-6, 0x1.ced916872b021p-8, 0x0.0p+0, 0x0.0p+0}}, {39, {0x1.69fbe76c8b439p-4, 0x1.69fbe76c8b439p-6, 0x0.0p+0, 0x0.0p+0}}, {40, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6, 0x0.0p+0, 0x0.0p+0}}, {41, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6, 0x0.0p+0, 0x0.0p+0}}},
     0x0e926d5057de519dULL,
     "80027d710028580c00000073746172745f666163746f727101473fd0000000000000580a000000656e645f666163746f727102473feccccccccccccd"
     "580b000000746f74616c5f697465727371034b285808000000626173655f6c727371045d710528473fb999999999999a473f9999999999999a65580a"
     "0000006c6173745f65706f636871064b25580b0000005f737465705f636f756e7471074b26580b0000005f69735f696e697469616c710889581a0000"
     "005f6765745f6c725f63616c6c65645f77697468696e5f7374657071098958080000005f6c6173745f6c72710a5d710b28473fb5cac083126e98473f"
     "95cac083126e9865752e"},
    {"LinearLR()", {0.3}, 0x6234666a8cb099e1ULL,
     {{0, {0x1.9999999999999p-4, 0x0.0p+0}}, {1, {0x1.1eb851eb851ecp-3, 0x0.0p+0}}, {4, {0x1.0a3d70a3d70a5p-2, 0x0.0p+0}}, {5, {0x1.3333333333334p-2, 0x0.0p+0}}, {6, {0x1.3333333333334p-2, 0x0.0p+0}}},
     0, nullptr},
    {"LinearLR(start_factor=1.0, end_factor=0.05, total_iters=200)", {0.3, 0.07}, 0xf27855ae989990ffULL,
     {{0, {0x1.3333333333333p-2, 0x1.1eb851eb851ecp-4, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.31bda5119ce07p-2, 0x1.1d5bab21815a1p-4, 0x0.0p+0, 0x0.0p+0}}, {199, {0x1.0d1b71758e21dp-6, 0x1.f6555c52e72fep-9, 0x0.0p+0, 0x0.0p+0}}, {200, {0x1.eb851eb851ec1p-7, 0x1.cac083126e99bp-9, 0x0.0p+0, 0x0.0p+0}}, {201, {0x1.eb851eb851ec1p-7, 0x1.cac083126e99bp-9, 0x0.0p+0, 0x0.0p+0}}},
     0, nullptr},
    {"ConstantLR(factor=0.4, total_iters=50)", {0.1, 0.025}, 0x9a08b3d8a97af4cdULL,
     {{0, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7, 0x0.0p+0, 0x0.0p+0}}, {49, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7, 0x0.0p+0, 0x0.0p+0}}, {50, {0x1.999999999999bp-4, 0x1.999999999999bp-6, 0x0.0p+0, 0x0.0p+0}}, {51, {0x1.999999999999bp-4, 0x1.999999999999bp-6, 0x0.0p+0, 0x0.0p+0}}},
     0xc03568b1c06961b5ULL,
     "80027d7100285806000000666163746f727101473fd999999999999a580b000000746f74616c5f697465727371024b325808000000626173655f6c72"
     "7371035d710428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e"
     "7471064b26580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f737465707108895808"
     "0000005f6c6173745f6c7271095d710a28473fa47ae147ae147c473f847ae147ae147c65752e"},
    {"ConstantLR()", {0.3}, 0x8b61149f31599dcbULL,
     {{0, {0x1.9999999999999p-4, 0x0.0p+0}}, {4, {0x1.9999999999999p-4, 0x0.0p+0}}, {5, {0x1.3333333333333p-2, 0x0.0p+0}}, {6, {0x1.3333333333333p-2, 0x0.0p+0}}},
     0, nullptr},
    {"CosineAnnealingLR(T_max=50, eta_min=0.001)", {0.1, 0.025}, 0xf1593d5914630a4bULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.99332da5339a5p-4, 0x1.993648307c831p-6, 0x0.0p+0, 0x0.0p+0}}, {49, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10, 0x0.0p+0, 0x0.0p+0}}, {50, {0x1.0624dd2f1a9fcp-10, 0x1.0624dd2f1a9fcp-10, 0x0.0p+0, 0x0.0p+0}}, {51, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10, 0x0.0p+0, 0x0.0p+0}}, {52, {0x1.6c76f2fa8fad6p-10, 0x1.1ef2f1fb94175p-10, 0x0.0p+0, 0x0.0p+0}}, {100, {0x1.9999999999991p-4, 0x1.9999999999972p-6, 0x0.0p+0, 0x0.0p+0}}, {151, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.9999999999996p-4, 0x1.9999999999973p-6, 0x0.0p+0, 0x0.0p+0}}},
     0x9b0080f049378739ULL,
     "80027d7100285805000000545f6d617871014b3258070000006574615f6d696e7102473f50624dd2f1a9fc5808000000626173655f6c727371035d71"
     "0428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e7471064b26"
     "580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071088958080000005f6c"
     "6173745f6c7271095d710a28473f9103804a2668d6473f7399e45a85708265752e"},
    {"CosineAnnealingLR(T_max=7)", {0.3}, 0xed51657efff2fa9cULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.23fd232f03555p-2, 0x0.0p+0}}, {7, {0x0.0p+0, 0x0.0p+0}}, {8, {0x1.e6c20085fbbc3p-7, 0x0.0p+0}}, {9, {0x1.cea7de049c538p-5, 0x0.0p+0}}, {15, {0x1.23fd232f03557p-2, 0x0.0p+0}}, {22, {0x1.e6c20085fbbc3p-7, 0x0.0p+0}}},
     0, nullptr},
    {"LambdaLR(lr_lambda=[lambda e: 1.0 / (1 + e // 30), lambda e: 0.97 ** e])", {0.1, 0.025}, 0x395b92a762a3d505ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.999999999999ap-4, 0x1.8d4fdf3b645a2p-6, 0x0.0p+0, 0x0.0p+0}}, {29, {0x1.999999999999ap-4, 0x1.52aa396c6581ap-7, 0x0.0p+0, 0x0.0p+0}}, {30, {0x1.999999999999ap-5, 0x1.4881470f8b6bdp-7, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.29e4129e4129fp-7, 0x1.68cd931fced24p-19, 0x0.0p+0, 0x0.0p+0}}},
     0x3326f9830359c219ULL,
     "80027d7100285808000000626173655f6c727371015d710228473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871"
     "034b25580b0000005f737465705f636f756e7471044b26580b0000005f69735f696e697469616c710589581a0000005f6765745f6c725f63616c6c65"
     "645f77697468696e5f7374657071068958080000005f6c6173745f6c7271075d710828473fa999999999999a473f8096d28570b76465580a0000006c"
     "725f6c616d6264617371095d710a284e4e65752e"},
    {"LambdaLR(lr_lambda=lambda e: 0.95 ** e)", {0.3}, 0x79e7add462bcef65ULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.23d70a3d70a3dp-2, 0x0.0p+0}}, {2, {0x1.153f7ced91687p-2, 0x0.0p+0}}, {300, {0x1.0b669ad82bb31p-24, 0x0.0p+0}}},
     0, nullptr},
    {"MultiplicativeLR(lr_lambda=lambda e: 0.5 if e % 25 == 0 else 0.995)", {0.1, 0.025}, 0x9a191e02f8a9a3c2ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.978d4fdf3b646p-4, 0x1.978d4fdf3b646p-6, 0x0.0p+0, 0x0.0p+0}}, {24, {0x1.6b2c5bf0c75b2p-4, 0x1.6b2c5bf0c75b2p-6, 0x0.0p+0, 0x0.0p+0}}, {25, {0x1.6b2c5bf0c75b2p-5, 0x1.6b2c5bf0c75b2p-7, 0x0.0p+0, 0x0.0p+0}}, {26, {0x1.695b7f522284fp-5, 0x1.695b7f522284fp-7, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.82c867f9e6f05p-18, 0x1.82c867f9e6f05p-20, 0x0.0p+0, 0x0.0p+0}}},
     0x1bfd751b9ed0d732ULL,
     "80027d7100285808000000626173655f6c727371015d710228473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871"
     "034b25580b0000005f737465705f636f756e7471044b26580b0000005f69735f696e697469616c710589581a0000005f6765745f6c725f63616c6c65"
     "645f77697468696e5f7374657071068958080000005f6c6173745f6c7271075d710828473fa55f8e4cedc46f473f855f8e4cedc46f65580a0000006c"
     "725f6c616d6264617371095d710a284e4e65752e"},
    {"PolynomialLR(total_iters=120, power=2.0)", {0.1, 0.025}, 0xf5bdb7227485fa95ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.92cd414ef6372p-4, 0x1.92cd414ef6372p-6, 0x0.0p+0, 0x0.0p+0}}, {119, {0x1.d208a5a912dfap-18, 0x1.d208a5a912dfap-20, 0x0.0p+0, 0x0.0p+0}}, {120, {0x0.0p+0, 0x0.0p+0, 0x0.0p+0, 0x0.0p+0}}, {121, {0x0.0p+0, 0x0.0p+0, 0x0.0p+0, 0x0.0p+0}}},
     0x04171c758b3d625dULL,
     "80027d710028580b000000746f74616c5f697465727371014b785805000000706f77657271024740000000000000005808000000626173655f6c7273"
     "71035d710428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e74"
     "71064b26580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f73746570710889580800"
     "00005f6c6173745f6c7271095d710a28473fa87e8558f9669f473f887e8558f9669f65752e"},
    {"PolynomialLR()", {0.3}, 0x09e0fbe59cf5376dULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.eb851eb851eb8p-3, 0x0.0p+0}}, {4, {0x1.eb851eb851eb6p-5, 0x0.0p+0}}, {5, {0x0.0p+0, 0x0.0p+0}}, {6, {0x0.0p+0, 0x0.0p+0}}},
     0, nullptr},
    {"PolynomialLR(total_iters=90, power=0.5)", {0.3}, 0xa05e1a247e9bc366ULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.317d12aa80111p-2, 0x0.0p+0}}, {89, {0x1.030dc4ea03a66p-5, 0x0.0p+0}}, {90, {0x0.0p+0, 0x0.0p+0}}, {91, {0x0.0p+0, 0x0.0p+0}}},
     0, nullptr},
    {"CosineAnnealingWarmRestarts(T_0=10, T_mult=2, eta_min=0.0001)", {0.1, 0.025}, 0x16c7db5e1eb87999ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.8f961e30a3466p-4, 0x1.8f9dd0ea39ecbp-6, 0x0.0p+0, 0x0.0p+0}}, {9, {0x1.4d8ade945889dp-9, 0x1.73e6dbc22e24ep-11, 0x0.0p+0, 0x0.0p+0}}, {10, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {11, {0x1.9714c28c89728p-4, 0x1.9716b24827dccp-6, 0x0.0p+0, 0x0.0p+0}}, {29, {0x1.76d94c5e4c161p-11, 0x1.09956008e0474p-12, 0x0.0p+0, 0x0.0p+0}}, {30, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {70, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.15d0500dce8fep-10, 0x1.63b38cda90bf7p-12, 0x0.0p+0, 0x0.0p+0}}},
     0x235c7e234bc6d9d6ULL,
     "80027d7100285803000000545f3071014b0a5803000000545f6971024b285806000000545f6d756c7471034b0258070000006574615f6d696e710447"
     "3f1a36e2eb1c432d5805000000545f63757271054b075808000000626173655f6c727371065d710728473fb999999999999a473f9999999999999a65"
     "580a0000006c6173745f65706f636871084b25580b0000005f737465705f636f756e7471094b00580b0000005f69735f696e697469616c710a89581a"
     "0000005f6765745f6c725f63616c6c65645f77697468696e5f73746570710b8958080000005f6c6173745f6c72710c5d710d28473fb7b736d3243f07"
     "473f97b8a9aafe290165752e"},
    {"CosineAnnealingWarmRestarts(T_0=7)", {0.3}, 0xf924fc06af6a2d9aULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.23fd232f03555p-2, 0x0.0p+0}}, {6, {0x1.e6c20085fbbccp-7, 0x0.0p+0}}, {7, {0x1.3333333333333p-2, 0x0.0p+0}}, {8, {0x1.23fd232f03555p-2, 0x0.0p+0}}, {300, {0x1.e6c20085fbbccp-7, 0x0.0p+0}}},
     0, nullptr},
    {"OneCycleLR(max_lr=[1.0, 0.5], total_steps=300)", {0.1, 0.025}, 0x60427d4481a1ae2dULL,
     {{0, {0x1.47ae147ae1480p-5, 0x1.47ae147ae1480p-6, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {1, {0x1.4a2126500f650p-5, 0x1.4a2126500f650p-6, 0x1.e6625148adc43p-1, 0x1.e6625148adc43p-1}}, {89, {0x1.0000000000000p+0, 0x1.0000000000000p-1, 0x1.b333333333333p-1, 0x1.b333333333333p-1}}, {90, {0x1.fff8aaaadb66fp-1, 0x1.fff8aaaadb66fp-2, 0x1.b333eeef1b45fp-1, 0x1.b333eeef1b45fp-1}}, {91, {0x1.ffe2ab16fbeb1p-1, 0x1.ffe2ab16fbeb1p-2, 0x1.b3362218120cfp-1, 0x1.b3362218120cfp-1}}, {299, {0x1.0c6f7a0b5ed8dp-18, 0x1.0c6f7a0b5ed8dp-19, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {300, {0x1.f6e33867b186fp-15, 0x1.f6e33867b186fp-16, 0x1.e665aaaa7e53ap-1, 0x1.e665aaaa7e53ap-1}}},
     0x5709ab4acbe32a59ULL,
     "80027d710028580b000000746f74616c5f737465707371014d2c0158100000005f7363686564756c655f70686173657371025d7103287d7104285808"
     "000000656e645f737465707105474056400000000000580800000073746172745f6c727106580a000000696e697469616c5f6c727107580600000065"
     "6e645f6c72710858060000006d61785f6c727109580e00000073746172745f6d6f6d656e74756d710a580c0000006d61785f6d6f6d656e74756d710b"
     "580c000000656e645f6d6f6d656e74756d710c580d000000626173655f6d6f6d656e74756d710d757d710e2868054d2b016806680968085806000000"
     "6d696e5f6c72710f680a680d680c680b756558110000005f616e6e65616c5f66756e635f7479706571105803000000636f737111580e000000637963"
     "6c655f6d6f6d656e74756d71128858090000007573655f62657461317113895808000000626173655f6c727371145d711528473fa47ae147ae147b47"
     "3f947ae147ae147b65580a0000006c6173745f65706f636871164b25580b0000005f737465705f636f756e7471174b26580b0000005f69735f696e69"
     "7469616c711889581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071198958080000005f6c6173745f6c72711a5d711b28"
     "473fd93de86ad493f2473fc93de86ad493f265752e"},
    {"OneCycleLR(max_lr=0.3, total_steps=300, pct_start=0.25, anneal_strategy='linear', three_phase=True, div_factor=10.0, final_div_factor=100.0)", {0.3}, 0x533cb833dc3b732fULL,
     {{0, {0x1.eb851eb851eb8p-6, 0x1.e666666666666p-1}}, {1, {0x1.13a654b0046d9p-5, 0x1.e5b54692ae5b5p-1}}, {74, {0x1.3333333333334p-2, 0x1.b333333333333p-1}}, {75, {0x1.2f76ba88b7c43p-2, 0x1.b3e45306eb3e4p-1}}, {148, {0x1.eb851eb851eb0p-6, 0x1.e666666666666p-1}}, {149, {0x1.e84c25caad117p-6, 0x1.e666666666666p-1}}, {150, {0x1.e5132cdd08376p-6, 0x1.e666666666666p-1}}, {300, {0x1.b1519e7072900p-14, 0x1.e666666666666p-1}}},
     0x15e9a4974ee5eda0ULL,
     "80027d710028580b000000746f74616c5f737465707371014d2c0158100000005f7363686564756c655f70686173657371025d7103287d7104285808"
     "000000656e645f737465707105474052800000000000580800000073746172745f6c727106580a000000696e697469616c5f6c727107580600000065"
     "6e645f6c72710858060000006d61785f6c727109580e00000073746172745f6d6f6d656e74756d710a580c0000006d61785f6d6f6d656e74756d710b"
     "580c000000656e645f6d6f6d656e74756d710c580d000000626173655f6d6f6d656e74756d710d757d710e2868054740628000000000006806680968"
     "086807680a680d680c680b757d710f2868054d2b0168066807680858060000006d696e5f6c727110680a680b680c680b756558110000005f616e6e65"
     "616c5f66756e635f74797065711158060000006c696e6561727112580e0000006379636c655f6d6f6d656e74756d71138858090000007573655f6265"
     "7461317114895808000000626173655f6c727371155d7116473f9eb851eb851eb861580a0000006c6173745f65706f636871174b25580b0000005f73"
     "7465705f636f756e7471184b26580b0000005f69735f696e697469616c711989581a0000005f6765745f6c725f63616c6c65645f77697468696e5f73"
     "746570711a8958080000005f6c6173745f6c72711b5d711c473fc51eb851eb851f61752e"},
    {"Adam: OneCycleLR(max_lr=0.01, epochs=3, steps_per_epoch=100)", {0.001, 0.002}, 0xf1d3d5d7b7b2d86dULL,
     {{0, {0x1.a36e2eb1c4320p-12, 0x1.a36e2eb1c4320p-12, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {1, {0x1.a690d4e15b620p-12, 0x1.a690d4e15b620p-12, 0x1.e6625148adc43p-1, 0x1.e6625148adc43p-1}}, {89, {0x1.47ae147ae147bp-7, 0x1.47ae147ae147bp-7, 0x1.b333333333333p-1, 0x1.b333333333333p-1}}, {90, {0x1.47a962fcb5609p-7, 0x1.47a962fcb5609p-7, 0x1.b333eeef1b45fp-1, 0x1.b333eeef1b45fp-1}}, {300, {0x1.41d919dbf6bccp-21, 0x1.41d919dbf6bccp-21, 0x1.e665aaaa7e53ap-1, 0x1.e665aaaa7e53ap-1}}},
     0x82ea18b8509f3f0dULL,
     "80027d710028580b000000746f74616c5f737465707371014d2c0158100000005f7363686564756c655f70686173657371025d7103287d7104285808"
     "000000656e645f737465707105474056400000000000580800000073746172745f6c727106580a000000696e697469616c5f6c727107580600000065"
     "6e645f6c72710858060000006d61785f6c727109580e00000073746172745f6d6f6d656e74756d710a580c0000006d61785f6d6f6d656e74756d710b"
     "580c000000656e645f6d6f6d656e74756d710c580d000000626173655f6d6f6d656e74756d710d757d710e2868054d2b016806680968085806000000"
     "6d696e5f6c72710f680a680d680c680b756558110000005f616e6e65616c5f66756e635f7479706571105803000000636f737111580e000000637963"
     "6c655f6d6f6d656e74756d71128858090000007573655f62657461317113885808000000626173655f6c727371145d711528473f3a36e2eb1c432d47"
     "3f3a36e2eb1c432d65580a0000006c6173745f65706f636871164b25580b0000005f737465705f636f756e7471174b26580b0000005f69735f696e69"
     "7469616c711889581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071198958080000005f6c6173745f6c72711a5d711b28"
     "473f70279efcb10286473f70279efcb1028665752e"},
    {"OneCycleLR(max_lr=0.2, total_steps=300, cycle_momentum=False)", {0.1}, 0x9048306b30d811ddULL,
     {{0, {0x1.0624dd2f1aa00p-7, 0x0.0p+0}}, {1, {0x1.081a850cd91d0p-7, 0x0.0p+0}}, {300, {0x1.924f6052f46c0p-17, 0x0.0p+0}}},
     0, nullptr},
    {"CyclicLR(base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=20)", {0.1, 0.025}, 0xec44e416b9807d75ULL,
     {{0, {0x1.47ae147ae147bp-7, 0x1.47ae147ae147bp-7, 0x1.ccccccccccccdp-1, 0x1.ccccccccccccdp-1}}, {1, {0x1.db22d0e560410p-7, 0x1.89374bc6a7ef6p-7, 0x1.ca3d70a3d70a4p-1, 0x1.ca3d70a3d70a4p-1}}, {19, {0x1.872b020c49ba7p-4, 0x1.89374bc6a7efbp-5, 0x1.9c28f5c28f5c3p-1, 0x1.9c28f5c28f5c3p-1}}, {20, {0x1.999999999999ap-4, 0x1.999999999999ap-5, 0x1.999999999999ap-1, 0x1.999999999999ap-1}}, {21, {0x1.872b020c49ba7p-4, 0x1.89374bc6a7efbp-5, 0x1.9c28f5c28f5c3p-1, 0x1.9c28f5c28f5c3p-1}}, {40, {0x1.47ae147ae147bp-7, 0x1.47ae147ae147bp-7, 0x1.ccccccccccccdp-1, 0x1.ccccccccccccdp-1}}, {41, {0x1.db22d0e560410p-7, 0x1.89374bc6a7ef6p-7, 0x1.ca3d70a3d70a4p-1, 0x1.ca3d70a3d70a4p-1}}, {300, {0x1.999999999999ap-4, 0x1.999999999999ap-5, 0x1.999999999999ap-1, 0x1.999999999999ap-1}}},
     0x235e3d5793063f3fULL,
     "80027d71002858070000006d61785f6c727371015d710228473fb999999999999a473fa999999999999a65580a000000746f74616c5f73697a657103"
     "474044000000000000580a000000737465705f726174696f7104473fe000000000000058040000006d6f64657105580a000000747269616e67756c61"
     "727106580500000067616d6d617107473ff0000000000000580a0000007363616c655f6d6f6465710858050000006379636c657109580e0000006379"
     "636c655f6d6f6d656e74756d710a8858090000007573655f6265746131710b89580e000000626173655f6d6f6d656e74756d73710c5d710d28473fe9"
     "99999999999a473fe999999999999a65580d0000006d61785f6d6f6d656e74756d73710e5d710f28473feccccccccccccd473feccccccccccccd6558"
     "08000000626173655f6c727371105d711128473f847ae147ae147b473f847ae147ae147b65580a0000006c6173745f65706f636871124b25580b0000"
     "005f737465705f636f756e7471134b26580b0000005f69735f696e697469616c711489581a0000005f6765745f6c725f63616c6c65645f7769746869"
     "6e5f7374657071158958080000005f6c6173745f6c7271165d711728473f9810624dd2f1a8473f90624dd2f1a9fb6558100000005f7363616c655f66"
     "6e5f637573746f6d71184e752e"},
    {"CyclicLR(base_lr=0.001, max_lr=0.1, step_size_up=15, step_size_down=25, mode='triangular2')", {0.3}, 0x61cea2ac793b8728ULL,
     {{0, {0x1.0624dd2f1a9fcp-10, 0x1.ccccccccccccdp-1}}, {15, {0x1.999999999999ap-4, 0x1.999999999999ap-1}}, {40, {0x1.0624dd2f1a9fcp-10, 0x1.ccccccccccccdp-1}}, {55, {0x1.9db22d0e56042p-5, 0x1.b333333333334p-1}}, {80, {0x1.0624dd2f1a9fcp-10, 0x1.ccccccccccccdp-1}}, {300, {0x1.a858793dd97f6p-10, 0x1.cc7ae147ae148p-1}}},
     0, nullptr},
    {"Adam: CyclicLR(base_lr=[0.01, 0.002], max_lr=[0.1, 0.04], step_size_up=10, mode='exp_range', gamma=0.995)", {0.1, 0.025}, 0x987c834cac03c484ULL,
     {{0, {0x1.47ae147ae147bp-7, 0x1.0624dd2f1a9fcp-9, 0x1.ccccccccccccdp-1, 0x1.ccccccccccccdp-1}}, {10, {0x1.8793c5e6e998dp-4, 0x1.3875f59fb8be8p-5, 0x1.9c1a68c7c0446p-1, 0x1.9c1a68c7c0446p-1}}, {20, {0x1.47ae147ae147bp-7, 0x1.0624dd2f1a9fcp-9, 0x1.ccccccccccccdp-1, 0x1.ccccccccccccdp-1}}, {300, {0x1.47ae147ae147bp-7, 0x1.0624dd2f1a9fcp-9, 0x1.ccccccccccccdp-1, 0x1.ccccccccccccdp-1}}},
     0xf3b22045caceaebaULL,
     "80027d71002858070000006d61785f6c727371015d710228473fb999999999999a473fa47ae147ae147b65580a000000746f74616c5f73697a657103"
     "474034000000000000580a000000737465705f726174696f7104473fe000000000000058040000006d6f6465710558090000006578705f72616e6765"
     "7106580500000067616d6d617107473fefd70a3d70a3d7580a0000007363616c655f6d6f64657108580a000000697465726174696f6e737109580e00"
     "00006379636c655f6d6f6d656e74756d710a8858090000007573655f6265746131710b88580e000000626173655f6d6f6d656e74756d73710c5d710d"
     "28473fe999999999999a473fe999999999999a65580d0000006d61785f6d6f6d656e74756d73710e5d710f28473feccccccccccccd473feccccccccc"
     "cccd655808000000626173655f6c727371105d711128473f847ae147ae147b473f60624dd2f1a9fc65580a0000006c6173745f65706f636871124b25"
     "580b0000005f737465705f636f756e7471134b26580b0000005f69735f696e697469616c711489581a0000005f6765745f6c725f63616c6c65645f77"
     "697468696e5f7374657071158958080000005f6c6173745f6c7271165d711728473fa09a96434acfc2473f877daf454698e86558100000005f736361"
     "6c655f666e5f637573746f6d71184e752e"},
    {"CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=7, scale_fn=lambda x: 1 / (1 + 0.01 * x), scale_mode='iterations', cycle_momentum=False)", {0.3}, 0x4460ec004f524f4aULL,
     {{0, {0x1.47ae147ae147bp-7, 0x0.0p+0}}, {7, {0x1.817bbdc663567p-4, 0x0.0p+0}}, {14, {0x1.47ae147ae147bp-7, 0x0.0p+0}}, {300, {0x1.dfd1304637958p-6, 0x0.0p+0}}},
     0, nullptr},
    {"SequentialLR([LinearLR(start_factor=0.1, total_iters=5), CosineAnnealingLR(T_max=95)], milestones=[5])", {0.1, 0.025}, 0x6d31b48d0c284a1dULL,
     {{0, {0x1.47ae147ae147cp-7, 0x1.47ae147ae147cp-9, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.cac083126e97ap-6, 0x1.cac083126e97ap-8, 0x0.0p+0, 0x0.0p+0}}, {4, {0x1.4fdf3b645a1cbp-4, 0x1.4fdf3b645a1cbp-6, 0x0.0p+0, 0x0.0p+0}}, {5, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {6, {0x1.997cef5820c20p-4, 0x1.997cef5820c20p-6, 0x0.0p+0, 0x0.0p+0}}, {99, {0x1.caa4178d7a664p-16, 0x1.caa4178d7a664p-18, 0x0.0p+0, 0x0.0p+0}}, {100, {0x0.0p+0, 0x0.0p+0, 0x0.0p+0, 0x0.0p+0}}, {101, {0x1.caa4178d7a667p-16, 0x1.caa4178d7a667p-18, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.6317957d834cep-9, 0x1.6317957d834cep-11, 0x0.0p+0, 0x0.0p+0}}},
     0xdab720ee7aca91a9ULL,
     "80027d710028580b0000005f6d696c6573746f6e657371015d71024b0561580a0000006c6173745f65706f636871034b2558080000005f6c6173745f"
     "6c7271045d710528473fb313d1da4e9d53473f9313d1da4e9d5365580b0000005f7363686564756c65727371065d7107287d710828580c0000007374"
     "6172745f666163746f727109473fb999999999999a580a000000656e645f666163746f72710a473ff0000000000000580b000000746f74616c5f6974"
     "657273710b4b055808000000626173655f6c7273710c5d710d28473fb999999999999a473f9999999999999a6568034b04580b0000005f737465705f"
     "636f756e74710e4b05580b0000005f69735f696e697469616c710f89581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071"
     "108968045d711128473fb4fdf3b645a1cb473f94fdf3b645a1cb65757d7112285805000000545f6d617871134b5f58070000006574615f6d696e7114"
     "470000000000000000680c5d711528473fb999999999999a473f9999999999999a6568034b20680e4b21680f89681089680468057565752e"},
    {"SequentialLR([ConstantLR(factor=0.5, total_iters=10), ExponentialLR(gamma=0.98), StepLR(step_size=30, gamma=0.5)], milestones=[20, 120])", {0.3}, 0x4948c171a7e2e807ULL,
     {{0, {0x1.3333333333333p-3, 0x0.0p+0}}, {10, {0x1.3333333333333p-2, 0x0.0p+0}}, {19, {0x1.3333333333333p-2, 0x0.0p+0}}, {20, {0x1.3333333333333p-2, 0x0.0p+0}}, {21, {0x1.2d0e560418937p-2, 0x0.0p+0}}, {120, {0x1.3333333333333p-2, 0x0.0p+0}}, {121, {0x1.3333333333333p-2, 0x0.0p+0}}, {300, {0x1.3333333333333p-8, 0x0.0p+0}}},
     0xa3f289f29d06176cULL,
     "80027d710028580b0000005f6d696c6573746f6e657371015d7102284b144b7865580a0000006c6173745f65706f636871034b2558080000005f6c61"
     "73745f6c7271045d7105473fcb3ceaac3688cb61580b0000005f7363686564756c65727371065d7107287d7108285806000000666163746f72710947"
     "3fe0000000000000580b000000746f74616c5f6974657273710a4b0a5808000000626173655f6c7273710b5d710c473fd33333333333336168034b13"
     "580b0000005f737465705f636f756e74710d4b14580b0000005f69735f696e697469616c710e89581a0000005f6765745f6c725f63616c6c65645f77"
     "697468696e5f73746570710f8968045d7110473fd333333333333361757d711128580500000067616d6d617112473fef5c28f5c28f5c680b5d711347"
     "3fd33333333333336168034b11680d4b12680e89680f8968046805757d7114285809000000737465705f73697a6571154b1e6812473fe00000000000"
     "00680b5d7116473fd33333333333336168034affffffff680d4b01680e89680f8968045d7117473fc3333333333333617565752e"},
    {"SequentialLR([LinearLR(start_factor=0.01, total_iters=10), MultiplicativeLR(lr_lambda=lambda e: 0.99), CosineAnnealingWarmRestarts(T_0=20)], milestones=[10, 100])", {0.1, 0.025}, 0xae9a06c22580ab81ULL,
     {{0, {0x1.0624dd2f1a9fcp-10, 0x1.0624dd2f1a9fcp-12, 0x0.0p+0, 0x0.0p+0}}, {9, {0x1.710cb295e9e18p-4, 0x1.710cb295e9e18p-6, 0x0.0p+0, 0x0.0p+0}}, {10, {0x1.6d5bee3d5fdcbp-4, 0x1.6d5bee3d5fdcbp-6, 0x0.0p+0, 0x0.0p+0}}, {11, {0x1.69b49c7f521a8p-4, 0x1.69b49c7f521a8p-6, 0x0.0p+0, 0x0.0p+0}}, {100, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {101, {0x1.97141d4dff4f2p-4, 0x1.97141d4dff4f2p-6, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}},
     0, nullptr},
    {"SequentialLR([LinearLR(start_factor=0.5, total_iters=4), OneCycleLR(max_lr=[1.0, 0.5], total_steps=250)], milestones=[50])", {0.1, 0.025}, 0x03d649c45ca86d1dULL,
     {{0, {0x1.47ae147ae147bp-6, 0x1.47ae147ae147bp-7, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {4, {0x1.47ae147ae147bp-5, 0x1.47ae147ae147bp-6, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {49, {0x1.47ae147ae147bp-5, 0x1.47ae147ae147bp-6, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {50, {0x1.47ae147ae1480p-5, 0x1.47ae147ae1480p-6, 0x1.e666666666666p-1, 0x1.e666666666666p-1}}, {51, {0x1.4b39171efa720p-5, 0x1.4b39171efa720p-6, 0x1.e6607eb754e72p-1, 0x1.e6607eb754e72p-1}}, {300, {0x1.62b1be3ed9403p-14, 0x1.62b1be3ed9403p-15, 0x1.e6655810b3d6dp-1, 0x1.e6655810b3d6dp-1}}},
     0, nullptr},
    {"SWALR(swa_lr=0.05, anneal_epochs=10)", {0.1, 0.025}, 0x962f60493aaeb183ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.94969370daa9ap-4, 0x1.a39fa5eb1779bp-6, 0x0.0p+0, 0x0.0p+0}}, {9, {0x1.a39fa5eb1779ap-5, 0x1.94969370daa9ap-5, 0x0.0p+0, 0x0.0p+0}}, {10, {0x1.999999999999ap-5, 0x1.999999999999ap-5, 0x0.0p+0, 0x0.0p+0}}, {11, {0x1.999999999999ap-5, 0x1.999999999999ap-5, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.999999999999ap-5, 0x1.999999999999ap-5, 0x0.0p+0, 0x0.0p+0}}},
     0x216e1f6a2957e4b1ULL,
     "80027d71002858100000005f616e6e65616c5f737472617465677971015803000000636f737102580d000000616e6e65616c5f65706f63687371034b"
     "0a5808000000626173655f6c727371045d710528473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871064b25580b"
     "0000005f737465705f636f756e7471074b26580b0000005f69735f696e697469616c710889581a0000005f6765745f6c725f63616c6c65645f776974"
     "68696e5f7374657071098958080000005f6c6173745f6c72710a5d710b28473fa999999999999a473fa999999999999a65752e"},
    {"SWALR(swa_lr=[0.01, 0.2], anneal_epochs=5, anneal_strategy='linear')", {0.1, 0.025}, 0x3b618819454c27f2ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.4fdf3b645a1ccp-4, 0x1.eb851eb851ebap-5, 0x0.0p+0, 0x0.0p+0}}, {4, {0x1.cac083126e979p-6, 0x1.51eb851eb8520p-3, 0x0.0p+0, 0x0.0p+0}}, {5, {0x1.47ae147ae147bp-7, 0x1.999999999999ap-3, 0x0.0p+0, 0x0.0p+0}}, {6, {0x1.47ae147ae147bp-7, 0x1.999999999999ap-3, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.47ae147ae147bp-7, 0x1.999999999999ap-3, 0x0.0p+0, 0x0.0p+0}}},
     0, nullptr},
    {"SWALR(swa_lr=0.05, anneal_epochs=0)", {0.3}, 0x623446edd5fa840cULL,
     {{0, {0x1.999999999999ap-5, 0x0.0p+0}}, {1, {0x1.999999999999ap-5, 0x0.0p+0}}, {2, {0x1.999999999999ap-5, 0x0.0p+0}}, {300, {0x1.999999999999ap-5, 0x0.0p+0}}},
     0, nullptr},
    {"ChainedScheduler([ConstantLR(factor=0.1, total_iters=4), ExponentialLR(gamma=0.99)])", {0.1, 0.025}, 0xa44b4a8c084bfb39ULL,
     {{0, {0x1.47ae147ae147cp-7, 0x1.47ae147ae147cp-9, 0x0.0p+0, 0x0.0p+0}}, {1, {0x1.4467381d7dbf6p-7, 0x1.4467381d7dbf6p-9, 0x0.0p+0, 0x0.0p+0}}, {3, {0x1.3df2945c98dd4p-7, 0x1.3df2945c98dd4p-9, 0x0.0p+0, 0x0.0p+0}}, {4, {0x1.8975cacc305e9p-4, 0x1.8975cacc305e9p-6, 0x0.0p+0, 0x0.0p+0}}, {5, {0x1.858688c506ed0p-4, 0x1.858688c506ed0p-6, 0x0.0p+0, 0x0.0p+0}}, {300, {0x1.4164f79eca7e0p-8, 0x1.4164f79eca7e0p-10, 0x0.0p+0, 0x0.0p+0}}},
     0xb9f663951a6fd869ULL,
     "80027d71002858080000005f6c6173745f6c7271015d710228473fb1a65f9f9b422d473f91a65f9f9b422d65580b0000005f7363686564756c657273"
     "71035d7104287d7105285806000000666163746f727106473fb999999999999a580b000000746f74616c5f697465727371074b045808000000626173"
     "655f6c727371085d710928473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f6368710a4b25580b0000005f737465705f"
     "636f756e74710b4b26580b0000005f69735f696e697469616c710c89581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071"
     "0d8968015d710e28473fb1d4037f9a3dac473f91d4037f9a3dac65757d710f28580500000067616d6d617110473fefae147ae147ae68085d71112847"
     "3fb999999999999a473f9999999999999a65680a4b25680b4b26680c89680d8968015d711228473fb1a65f9f9b422d473f91a65f9f9b422d65756575"
     "2e"},
    {"ChainedScheduler([LinearLR(start_factor=0.2, total_iters=10), LambdaLR(lr_lambda=lambda e: 0.97 ** e)])", {0.3}, 0x1b4bfee82f14200fULL,
     {{0, {0x1.3333333333333p-2, 0x0.0p+0}}, {1, {0x1.29fbe76c8b439p-2, 0x0.0p+0}}, {9, {0x1.d31601a2612a8p-3, 0x0.0p+0}}, {10, {0x1.c512c943e87dbp-3, 0x0.0p+0}}, {11, {0x1.b77b2ebf4f98ap-3, 0x0.0p+0}}, {300, {0x1.0e9a2e57db1dap-15, 0x0.0p+0}}},
     0, nullptr},
  };
  // clang-format on
  return references;
}

/// FNV-1a 64 over the eight little-endian bytes of each rate, as scheduler_reference.py hashes them.
struct RateHash {
  std::uint64_t value = 0xcbf29ce484222325ULL;
  void add(const std::vector<double>& rates) {
    for (const double r : rates) {
      const auto bits = std::bit_cast<std::uint64_t>(r);
      for (int byte = 0; byte < 8; ++byte) value = (value ^ ((bits >> (8 * byte)) & 0xffU)) * 0x100000001b3ULL;
    }
  }
};

/// An SGD (or, for a configuration named "Adam: ...", an Adam) whose groups start at the given learning rates.
struct GroupedOptimizer {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  bool adam;
  enum class Kind { sgd, adam };
  GroupedOptimizer(const std::vector<double>& lrs, Kind kind) : adam(kind == Kind::adam) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const double lr : lrs) {
      params.push_back(torch::zeros({1}, torch::requires_grad()));
      if (adam) groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<torch::optim::AdamOptions>(lr));
      else groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<torch::optim::SGDOptions>(lr));
    }
    if (adam) optimizer = std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(lrs.front()));
    else optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs.front()));
  }
  GroupedOptimizer(const std::vector<double>& lrs, const std::string& config)
      : GroupedOptimizer(lrs, config.rfind("Adam: ", 0) == 0 ? Kind::adam : Kind::sgd) {}
  /// Every group's learning rate, then every group's momentum (SGD's) or beta1 (Adam's).
  std::vector<double> rates() const {
    std::vector<double> out;
    for (const auto& g : optimizer->param_groups()) out.push_back(g.options().get_lr());
    for (const auto& g : optimizer->param_groups())
      out.push_back(adam ? std::get<0>(static_cast<const torch::optim::AdamOptions&>(g.options()).betas())
                         : static_cast<const torch::optim::SGDOptions&>(g.options()).momentum());
    return out;
  }
  void set_lrs(const std::vector<double>& rates) {
    for (std::size_t i = 0; i < optimizer->param_groups().size(); ++i) optimizer->param_groups()[i].options().set_lr(rates[i]);
  }
};

/// One of dettrial::optim's schedulers, whatever its type.
struct AnyScheduler {
  std::shared_ptr<void> held;
  std::function<void()> step;
  std::function<void(c10::impl::GenericDict&)> python_state;
  std::function<void(const c10::impl::GenericDict&, const std::string&)> load_python_state;
  std::function<std::int64_t()> last_epoch;
  /// save() into a LibTorch archive, as bytes; load() from them.
  std::function<std::string()> saved;
  std::function<void(const std::string&)> restore;
};

template <class S>
AnyScheduler erased(std::shared_ptr<S> s) {
  return {s,
          [s] { s->step(); },
          [s](c10::impl::GenericDict& d) { s->python_state(d); },
          [s](const c10::impl::GenericDict& d, const std::string& what) { s->load_python_state(d, what); },
          [s] {
            if constexpr (requires { s->last_epoch(); }) return s->last_epoch();
            else return s->template scheduler<0>().last_epoch();  // ChainedScheduler has none: its first child's
          },
          [s] {
            torch::serialize::OutputArchive archive;
            s->save(archive);
            std::ostringstream bytes;
            archive.save_to(bytes);
            return bytes.str();
          },
          [s](const std::string& bytes) {
            torch::serialize::InputArchive archive;
            std::istringstream in(bytes);
            archive.load_from(in);
            s->load(archive);
          }};
}

template <class S, class... Args>
AnyScheduler any_scheduler(torch::optim::Optimizer& optimizer, Args&&... args) {
  return erased(std::make_shared<S>(optimizer, std::forward<Args>(args)...));
}

/// OneCycleLR's, CyclicLR's and SWALR's configurations of scheduler_reference.py, made in C++.
std::optional<AnyScheduler> make_cyclic_scheduler(const std::string& config, torch::optim::Optimizer& o) {
  using namespace dettrial::optim;
  if (config == "OneCycleLR(max_lr=[1.0, 0.5], total_steps=300)")
    return any_scheduler<OneCycleLR>(o, OneCycleLROptions{.max_lr = std::vector<double>{1.0, 0.5}, .total_steps = 300});
  if (config ==
      "OneCycleLR(max_lr=0.3, total_steps=300, pct_start=0.25, anneal_strategy='linear', three_phase=True, div_factor=10.0, "
      "final_div_factor=100.0)")
    return any_scheduler<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.3,
                                                          .total_steps = 300,
                                                          .pct_start = 0.25,
                                                          .anneal_strategy = AnnealStrategy::linear,
                                                          .div_factor = 10.0,
                                                          .final_div_factor = 100.0,
                                                          .three_phase = true});
  if (config == "Adam: OneCycleLR(max_lr=0.01, epochs=3, steps_per_epoch=100)")
    return any_scheduler<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.01, .epochs = 3, .steps_per_epoch = 100});
  if (config == "OneCycleLR(max_lr=0.2, total_steps=300, cycle_momentum=False)")
    return any_scheduler<OneCycleLR>(o, OneCycleLROptions{.max_lr = 0.2, .total_steps = 300, .cycle_momentum = false});
  if (config == "CyclicLR(base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=20)")
    return any_scheduler<CyclicLR>(o, CyclicLROptions{.base_lr = 0.01, .max_lr = std::vector<double>{0.1, 0.05}, .step_size_up = 20});
  if (config == "CyclicLR(base_lr=0.001, max_lr=0.1, step_size_up=15, step_size_down=25, mode='triangular2')")
    return any_scheduler<CyclicLR>(
        o, CyclicLROptions{.base_lr = 0.001, .max_lr = 0.1, .step_size_up = 15, .step_size_down = 25, .mode = CyclicMode::triangular2});
  if (config == "Adam: CyclicLR(base_lr=[0.01, 0.002], max_lr=[0.1, 0.04], step_size_up=10, mode='exp_range', gamma=0.995)")
    return any_scheduler<CyclicLR>(o, CyclicLROptions{.base_lr = std::vector<double>{0.01, 0.002},
                                                      .max_lr = std::vector<double>{0.1, 0.04},
                                                      .step_size_up = 10,
                                                      .mode = CyclicMode::exp_range,
                                                      .gamma = 0.995});
  if (config ==
      "CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=7, scale_fn=lambda x: 1 / (1 + 0.01 * x), scale_mode='iterations', "
      "cycle_momentum=False)")
    return any_scheduler<CyclicLR>(o, CyclicLROptions{.base_lr = 0.01,
                                                      .max_lr = 0.1,
                                                      .step_size_up = 7,
                                                      .scale_fn = [](std::int64_t x) { return 1 / (1 + 0.01 * static_cast<double>(x)); },
                                                      .scale_mode = ScaleMode::iterations,
                                                      .cycle_momentum = false});
  if (config == "SWALR(swa_lr=0.05, anneal_epochs=10)") return any_scheduler<SWALR>(o, 0.05, 10);
  if (config == "SWALR(swa_lr=[0.01, 0.2], anneal_epochs=5, anneal_strategy='linear')")
    return any_scheduler<SWALR>(o, std::vector<double>{0.01, 0.2}, 5, AnnealStrategy::linear);
  if (config == "SWALR(swa_lr=0.05, anneal_epochs=0)") return any_scheduler<SWALR>(o, 0.05, 0);
  return std::nullopt;
}

/// SequentialLR's and ChainedScheduler's configurations of scheduler_reference.py, made in C++.
std::optional<AnyScheduler> make_composite_scheduler(const std::string& config, torch::optim::Optimizer& o) {
  using namespace dettrial::optim;
  if (config == "SequentialLR([LinearLR(start_factor=0.1, total_iters=5), CosineAnnealingLR(T_max=95)], milestones=[5])")
    return erased(std::make_shared<SequentialLR<LinearLR, CosineAnnealingLR>>(
        o, std::tuple{LinearLR(o, 0.1, 1.0, 5), CosineAnnealingLR(o, 95)}, std::vector<std::int64_t>{5}));
  if (config ==
      "SequentialLR([ConstantLR(factor=0.5, total_iters=10), ExponentialLR(gamma=0.98), StepLR(step_size=30, gamma=0.5)], "
      "milestones=[20, 120])")
    return erased(std::make_shared<SequentialLR<ConstantLR, ExponentialLR, StepLR>>(
        o, std::tuple{ConstantLR(o, 0.5, 10), ExponentialLR(o, 0.98), StepLR(o, 30, 0.5)}, std::vector<std::int64_t>{20, 120}));
  if (config ==
      "SequentialLR([LinearLR(start_factor=0.01, total_iters=10), MultiplicativeLR(lr_lambda=lambda e: 0.99), "
      "CosineAnnealingWarmRestarts(T_0=20)], milestones=[10, 100])")
    return erased(std::make_shared<SequentialLR<LinearLR, MultiplicativeLR, CosineAnnealingWarmRestarts>>(
        o,
        std::tuple{LinearLR(o, 0.01, 1.0, 10), MultiplicativeLR(o, [](std::int64_t) { return 0.99; }), CosineAnnealingWarmRestarts(o, 20)},
        std::vector<std::int64_t>{10, 100}));
  if (config ==
      "SequentialLR([LinearLR(start_factor=0.5, total_iters=4), OneCycleLR(max_lr=[1.0, 0.5], total_steps=250)], milestones=[50])")
    return erased(std::make_shared<SequentialLR<LinearLR, OneCycleLR>>(
        o, std::tuple{LinearLR(o, 0.5, 1.0, 4), OneCycleLR(o, {.max_lr = std::vector<double>{1.0, 0.5}, .total_steps = 250})},
        std::vector<std::int64_t>{50}));
  if (config == "ChainedScheduler([ConstantLR(factor=0.1, total_iters=4), ExponentialLR(gamma=0.99)])")
    return erased(std::make_shared<ChainedScheduler<ConstantLR, ExponentialLR>>(std::tuple{ConstantLR(o, 0.1, 4), ExponentialLR(o, 0.99)}));
  if (config == "ChainedScheduler([LinearLR(start_factor=0.2, total_iters=10), LambdaLR(lr_lambda=lambda e: 0.97 ** e)])")
    return erased(std::make_shared<ChainedScheduler<LinearLR, LambdaLR>>(
        std::tuple{LinearLR(o, 0.2, 1.0, 10), LambdaLR(o, [](std::int64_t e) { return std::pow(0.97, static_cast<double>(e)); })}));
  return std::nullopt;
}

/// The scheduler scheduler_reference.py's configuration `config` names, made in C++.
AnyScheduler make_scheduler(const std::string& config, torch::optim::Optimizer& o) {
  using namespace dettrial::optim;
  const auto power = [](double base) { return [base](std::int64_t e) { return std::pow(base, static_cast<double>(e)); }; };
  if (config == "LinearLR(start_factor=0.25, end_factor=0.9, total_iters=40)") return any_scheduler<LinearLR>(o, 0.25, 0.9, 40);
  if (config == "LinearLR()") return any_scheduler<LinearLR>(o);
  if (config == "LinearLR(start_factor=1.0, end_factor=0.05, total_iters=200)") return any_scheduler<LinearLR>(o, 1.0, 0.05, 200);
  if (config == "ConstantLR(factor=0.4, total_iters=50)") return any_scheduler<ConstantLR>(o, 0.4, 50);
  if (config == "ConstantLR()") return any_scheduler<ConstantLR>(o);
  if (config == "CosineAnnealingLR(T_max=50, eta_min=0.001)") return any_scheduler<CosineAnnealingLR>(o, 50, 0.001);
  if (config == "CosineAnnealingLR(T_max=7)") return any_scheduler<CosineAnnealingLR>(o, 7);
  if (config == "LambdaLR(lr_lambda=[lambda e: 1.0 / (1 + e // 30), lambda e: 0.97 ** e])")
    return any_scheduler<LambdaLR>(
        o, std::vector<LRLambda>{[](std::int64_t e) { return 1.0 / static_cast<double>(1 + e / 30); }, power(0.97)});
  if (config == "LambdaLR(lr_lambda=lambda e: 0.95 ** e)") return any_scheduler<LambdaLR>(o, LRLambda(power(0.95)));
  if (config == "MultiplicativeLR(lr_lambda=lambda e: 0.5 if e % 25 == 0 else 0.995)")
    return any_scheduler<MultiplicativeLR>(o, LRLambda([](std::int64_t e) { return e % 25 == 0 ? 0.5 : 0.995; }));
  if (config == "PolynomialLR(total_iters=120, power=2.0)") return any_scheduler<PolynomialLR>(o, 120, 2.0);
  if (config == "PolynomialLR()") return any_scheduler<PolynomialLR>(o);
  if (config == "PolynomialLR(total_iters=90, power=0.5)") return any_scheduler<PolynomialLR>(o, 90, 0.5);
  if (config == "CosineAnnealingWarmRestarts(T_0=10, T_mult=2, eta_min=0.0001)")
    return any_scheduler<CosineAnnealingWarmRestarts>(o, 10, 2, 0.0001);
  if (config == "CosineAnnealingWarmRestarts(T_0=7)") return any_scheduler<CosineAnnealingWarmRestarts>(o, 7);
  if (auto cyclic = make_cyclic_scheduler(config, o)) return *cyclic;
  if (auto composite = make_composite_scheduler(config, o)) return *composite;
  throw std::logic_error("no C++ scheduler for " + config);
}

/// A scheduler of the same type with other arguments, for `config` (a function cannot be restored
/// from Python's state, so LambdaLR's and MultiplicativeLR's keep theirs).
std::string other_arguments(const std::string& config) {
  static const std::map<std::string, std::string> others = {
      {"LinearLR(start_factor=0.25, end_factor=0.9, total_iters=40)", "LinearLR()"},
      {"ConstantLR(factor=0.4, total_iters=50)", "ConstantLR()"},
      {"CosineAnnealingLR(T_max=50, eta_min=0.001)", "CosineAnnealingLR(T_max=7)"},
      {"PolynomialLR(total_iters=120, power=2.0)", "PolynomialLR()"},
      {"CosineAnnealingWarmRestarts(T_0=10, T_mult=2, eta_min=0.0001)", "CosineAnnealingWarmRestarts(T_0=7)"}};
  const auto it = others.find(config);
  return it == others.end() ? config : it->second;
}

void check_same_python_value(const c10::IValue& ours, const c10::IValue& python);

/// The same entries with the same values (ours may have verbose too, which torch < 2.2 has).
void check_same_python_dict(const c10::impl::GenericDict& ours, const c10::impl::GenericDict& python) {
  for (const auto& entry : python) {
    const std::string key = entry.key().toStringRef();
    INFO("entry " << key);
    REQUIRE(ours.contains(key));
    check_same_python_value(ours.at(key), entry.value());
  }
  for (const auto& entry : ours) CHECK((python.contains(entry.key()) || entry.key().toStringRef() == "verbose"));
}

/// The same value, exactly: Python's None, bools, ints, floats (to the bit), strings, and lists and
/// dicts of them.
void check_same_python_value(const c10::IValue& ours, const c10::IValue& python) {
  if (python.isNone()) {
    CHECK(ours.isNone());
  } else if (python.isList()) {
    REQUIRE(ours.isList());
    const auto a = ours.toListRef();
    const auto b = python.toListRef();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) check_same_python_value(a[i], b[i]);
  } else if (python.isBool()) {
    CHECK((ours.isBool() && ours.toBool() == python.toBool()));
  } else if (python.isInt()) {
    CHECK((ours.isInt() && ours.toInt() == python.toInt()));
  } else if (python.isDouble()) {
    CHECK((ours.isDouble() && ours.toDouble() == python.toDouble()));
  } else if (python.isString()) {
    CHECK((ours.isString() && ours.toStringRef() == python.toStringRef()));
  } else if (python.isGenericDict()) {  // a nested scheduler's state, or one of OneCycleLR's phases
    REQUIRE(ours.isGenericDict());
    check_same_python_dict(ours.toGenericDict(), python.toGenericDict());
  } else {
    FAIL("a Python value of type " << python.tagKind());
  }
}

/// Restores a scheduler of `r`'s type made with other arguments on another optimizer with `restore`,
/// gives the optimizer the rates after 37 calls (its own state carries them in a checkpoint) and steps
/// it to 300: its rates after 38, ..., 300 calls must hash as Python's do.
void check_continues(const SchedulerReference& r, const std::vector<double>& saved_lrs, const std::function<void(AnyScheduler&)>& restore) {
  GroupedOptimizer fresh(std::vector<double>(r.lrs.size(), 0.5), r.config);
  AnyScheduler restored = make_scheduler(other_arguments(r.config), *fresh.optimizer);
  restore(restored);
  CHECK(restored.last_epoch() == saved_at);
  fresh.set_lrs(saved_lrs);
  RateHash after;
  for (int k = saved_at + 1; k <= reference_steps; ++k) {
    restored.step();
    after.add(fresh.rates());
  }
  CHECK(after.value == r.rates_after_saved);
}

}  // namespace

TEST_CASE(
    "python state: LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR, "
    "CosineAnnealingWarmRestarts, OneCycleLR, CyclicLR, SequentialLR, ChainedScheduler and SWALR give Python's "
    "learning rates and momenta for 300 steps, to the bit") {
  for (const SchedulerReference& r : scheduler_references()) {
    INFO(r.config);
    GroupedOptimizer g(r.lrs, r.config);
    AnyScheduler s = make_scheduler(r.config, *g.optimizer);
    RateHash all;
    std::map<int, std::vector<double>> rates;
    for (int k = 0; k <= reference_steps; ++k) {
      if (k > 0) s.step();
      all.add(g.rates());
      rates[k] = g.rates();
    }
    for (const auto& [k, expected] : r.samples) {
      INFO("after " << k << " step() calls");
      REQUIRE(rates[k].size() == expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        std::ostringstream both;  // doctest prints doubles rounded: these differ in the last bits
        both << std::hexfloat << "group " << i << ": " << rates[k][i] << ", Python's " << expected[i];
        INFO(both.str());
        CHECK(rates[k][i] == expected[i]);
      }
    }
    CHECK(all.value == r.all_rates);  // one rate one ulp off, at any step, changes it
  }
}

TEST_CASE(
    "python state: the new schedulers write Python's state_dict(), and continue as Python does from Python's pickled "
    "state, from their own and from save/load") {
  for (const SchedulerReference& r : scheduler_references()) {
    if (!r.state) continue;
    INFO(r.config);
    const auto python = dettrial::detail::unpickle(from_hex(r.state)).toGenericDict();
    // The same history in C++: the same entries, to the bit (and verbose, which torch < 2.2 has).
    GroupedOptimizer g(r.lrs, r.config);
    AnyScheduler s = make_scheduler(r.config, *g.optimizer);
    for (int k = 0; k < saved_at; ++k) s.step();
    c10::impl::GenericDict ours(c10::StringType::get(), c10::AnyType::get());
    s.python_state(ours);
    check_same_python_dict(ours, python);
    const std::vector<double> saved_lrs = g.rates();
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.load_python_state(python, "Python's state"); });
    const auto written = dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(ours), "scheduler").toGenericDict();
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.load_python_state(written, "dettrial's state"); });
    const std::string archived = s.saved();  // and dettrial's own checkpoint entry
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.restore(archived); });
  }
}

TEST_CASE("python state: the new schedulers refuse a bad argument naming the class, and another type's or a callable's state by entry") {
  using namespace dettrial::optim;
  GroupedOptimizer g({0.1, 0.2}, GroupedOptimizer::Kind::sgd);
  auto& o = *g.optimizer;
  CHECK_THROWS_WITH_AS(LinearLR(o, 0.0), doctest::Contains("LinearLR: start_factor must be in (0, 1], not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(LinearLR(o, 0.5, 1.5), doctest::Contains("LinearLR: end_factor must be in [0, 1], not 1.5"), ConfigError);
  CHECK_THROWS_WITH_AS(LinearLR(o, 0.5, 1.0, -1), doctest::Contains("LinearLR: total_iters must be at least 0, not -1"), ConfigError);
  CHECK_THROWS_WITH_AS(ConstantLR(o, 1.5), doctest::Contains("ConstantLR: factor must be in (0, 1], not 1.5"), ConfigError);
  CHECK_THROWS_WITH_AS(ConstantLR(o, 0.5, -2), doctest::Contains("ConstantLR: total_iters must be at least 0, not -2"), ConfigError);
  CHECK_THROWS_WITH_AS(CosineAnnealingLR(o, 0), doctest::Contains("CosineAnnealingLR: T_max must be at least 1, not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(CosineAnnealingLR(o, 10, -0.1), doctest::Contains("CosineAnnealingLR: eta_min must be at least 0, not -0.1"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(LambdaLR(o, std::vector<LRLambda>{[](std::int64_t) { return 1.0; }}),
                       doctest::Contains("LambdaLR: lr_lambda must be one function per parameter group (2), not 1 functions"), ConfigError);
  CHECK_THROWS_WITH_AS(MultiplicativeLR(o, LRLambda()), doctest::Contains("MultiplicativeLR: lr_lambda must be a function"), ConfigError);
  CHECK_THROWS_WITH_AS(PolynomialLR(o, 5, -1.0), doctest::Contains("PolynomialLR: power must be at least 0, not -1"), ConfigError);
  CHECK_THROWS_WITH_AS(CosineAnnealingWarmRestarts(o, 0), doctest::Contains("CosineAnnealingWarmRestarts: T_0 must be at least 1, not 0"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(CosineAnnealingWarmRestarts(o, 5, 0),
                       doctest::Contains("CosineAnnealingWarmRestarts: T_mult must be at least 1, not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(OneCycleLR(o, {.total_steps = 10}), doctest::Contains("OneCycleLR: max_lr must be positive (is it set?), not 0"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(OneCycleLR(o, {.max_lr = 0.1}),
                       doctest::Contains("OneCycleLR: total_steps must be given (or epochs and steps_per_epoch), not missing"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(OneCycleLR(o, {.max_lr = std::vector<double>{0.1}, .total_steps = 10}),
                       doctest::Contains("OneCycleLR: max_lr must have one value per parameter group (2), not 1"), ConfigError);
  CHECK_THROWS_WITH_AS(OneCycleLR(o, {.max_lr = 0.1, .total_steps = 10, .pct_start = 1.5}),
                       doctest::Contains("OneCycleLR: pct_start must be in [0, 1], not 1.5"), ConfigError);
  CHECK_THROWS_WITH_AS(CyclicLR(o, {.base_lr = 0.01, .max_lr = 0.1, .step_size_up = 0}),
                       doctest::Contains("CyclicLR: step_size_up must be positive, not 0"), ConfigError);
  {
    dettrial::optim::AdadeltaOptions adadelta_options(1.0);
    dettrial::optim::Adadelta adadelta(std::vector<torch::Tensor>{torch::zeros({1}, torch::requires_grad())}, adadelta_options);
    CHECK_THROWS_WITH_AS(OneCycleLR(adadelta, {.max_lr = 0.1, .total_steps = 10}),
                         doctest::Contains("OneCycleLR: cycle_momentum needs an optimizer with a momentum (SGD, RMSprop) or beta1"),
                         ConfigError);
    CHECK_NOTHROW(OneCycleLR(adadelta, {.max_lr = 0.1, .total_steps = 10, .cycle_momentum = false}));
  }
  {  // Python raises at the step after the last; dettrial before changing anything
    OneCycleLR one(o, {.max_lr = 0.1, .total_steps = 3});
    for (int k = 0; k < 3; ++k) one.step();
    const std::vector<double> last = one.get_last_lr();
    CHECK_THROWS_WITH_AS(one.step(), doctest::Contains("OneCycleLR: tried to step 4 times; the cycle has total_steps 3"), TrialError);
    CHECK(one.last_epoch() == 3);
    CHECK(one.get_last_lr() == last);
  }
  CHECK_THROWS_WITH_AS((SequentialLR(o, std::tuple{LinearLR(o), StepLR(o, 3)}, {5, 7})),
                       doctest::Contains("SequentialLR: milestones must be one fewer than the schedulers (1), not 2"), ConfigError);
  CHECK_THROWS_WITH_AS((SequentialLR(o, std::tuple{LinearLR(o), StepLR(o, 3), StepLR(o, 4)}, {9, 7})),
                       doctest::Contains("SequentialLR: milestones must not decrease, but 7 follows 9"), ConfigError);
  {
    GroupedOptimizer other({0.1, 0.2}, GroupedOptimizer::Kind::sgd);
    CHECK_THROWS_WITH_AS((SequentialLR(o, std::tuple{LinearLR(o), StepLR(*other.optimizer, 3)}, {5})),
                         doctest::Contains("SequentialLR: scheduler 1 drives another optimizer than the composite's"), ConfigError);
  }

  // Another type's state, by its first own entry; a callable object's attributes, by their index.
  const auto& linear = scheduler_references().front();
  REQUIRE(std::string(linear.config).rfind("LinearLR(", 0) == 0);
  const auto linear_state = dettrial::detail::unpickle(from_hex(linear.state)).toGenericDict();
  ConstantLR constant(o);
  CHECK_THROWS_WITH_AS(constant.load_python_state(linear_state, "LR scheduler 0"),
                       doctest::Contains("LR scheduler 0 has 'start_factor', which Python's ConstantLR does not have"), CheckpointError);
  LambdaLR lambda(o, [](std::int64_t e) { return 1.0 / static_cast<double>(e + 1); });
  c10::impl::GenericDict lambda_state(c10::StringType::get(), c10::AnyType::get());
  lambda.python_state(lambda_state);
  c10::impl::GenericDict attributes(c10::StringType::get(), c10::AnyType::get());
  attributes.insert("scale", 2.0);
  c10::impl::GenericList callables(c10::AnyType::get());
  callables.push_back(c10::IValue());
  callables.push_back(attributes);
  lambda_state.insert_or_assign("lr_lambdas", callables);
  CHECK_THROWS_WITH_AS(lambda.load_python_state(lambda_state, "LR scheduler 0"),
                       doctest::Contains("LR scheduler 0: lr_lambdas[1] holds the attributes of a Python callable object"),
                       CheckpointError);
  CHECK(lambda.last_epoch() == 0);  // refused before anything changed
}

// ------------------------------------------------------------------------------------------------
// AveragedModel against torch.optim.swa_utils.AveragedModel.

namespace {

/// What tests/python/averaging_reference.py prints for one configuration.
struct AveragingReference {
  const char* config;
  /// FNV-1a of every entry of the average's state_dict() after each of the 25 updates.
  std::uint64_t states;
  std::vector<std::string> names;
};

// Printed by tests/python/averaging_reference.py with torch 2.15.0 (its CPU arithmetic).
const std::vector<AveragingReference>& averaging_references() {
  // clang-format off: as the script prints it
  static const std::vector<AveragingReference> references = {
    {"ema(0.9)", 0x02eaffac87896472ULL, {"n_averaged", "module.0.weight", "module.0.bias", "module.1.weight", "module.1.bias", "module.1.running_mean", "module.1.running_var", "module.1.num_batches_tracked", "module.2.weight", "module.2.bias"}},
    {"ema(0.99, use_buffers)", 0x27302a6c55309a6aULL, {"n_averaged", "module.0.weight", "module.0.bias", "module.1.weight", "module.1.bias", "module.1.running_mean", "module.1.running_var", "module.1.num_batches_tracked", "module.2.weight", "module.2.bias"}},
    {"swa()", 0xb9e660bb017edd8aULL, {"n_averaged", "module.0.weight", "module.0.bias", "module.1.weight", "module.1.bias", "module.1.running_mean", "module.1.running_var", "module.1.num_batches_tracked", "module.2.weight", "module.2.bias"}},
    {"swa(use_buffers)", 0xb2874820b426e252ULL, {"n_averaged", "module.0.weight", "module.0.bias", "module.1.weight", "module.1.bias", "module.1.running_mean", "module.1.running_var", "module.1.num_batches_tracked", "module.2.weight", "module.2.bias"}},
  };
  // clang-format on
  return references;
}

/// averaging_reference.py's set_values: every parameter and buffer a function of k.
void set_averaging_values(torch::nn::Module& model, std::int64_t k) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> all = model.parameters();
  for (const auto& b : model.buffers()) all.push_back(b);
  for (auto& t : all) {
    if (t.scalar_type() == torch::kLong) t.fill_(3 * k);
    else
      t.copy_(
          torch::arange(t.numel(), torch::kFloat32).reshape(t.sizes()).mul(0.37).add(1.3 * static_cast<double>(k)).remainder(5.0).div(7.0));
  }
}

dettrial::optim::Averaging averaging_named(const std::string& config) {
  using namespace dettrial::optim;
  if (config == "ema(0.9)") return ema(0.9);
  if (config == "ema(0.99, use_buffers)") return ema(0.99, true);
  if (config == "swa()") return swa();
  if (config == "swa(use_buffers)") return swa(true);
  throw std::logic_error("no averaging " + config);
}

}  // namespace

TEST_CASE(
    "python state: AveragedModel averages as Python's swa_utils.AveragedModel (EMA and equal weights, buffers or not), in its layout") {
  for (const AveragingReference& r : averaging_references()) {
    INFO(r.config);
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2));
    dettrial::optim::AveragedModel<torch::nn::Sequential> averaged(model, averaging_named(r.config));
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (std::int64_t k = 0; k < 25; ++k) {
      set_averaging_values(*model, k);
      averaged.update_parameters(model);
      const auto state = dettrial::module_state_dict(*averaged.weights());
      for (const auto& entry : state) {
        const torch::Tensor t = entry.value().toTensor().contiguous();
        const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
        for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
      }
    }
    CHECK(h == r.states);  // one value one ulp off, after any update, changes it
    CHECK(averaged.n_averaged() == 25);
    std::vector<std::string> names;
    for (const auto& entry : dettrial::module_state_dict(*averaged.weights())) names.push_back(entry.key().toStringRef());
    CHECK(names == r.names);
  }
}

TEST_CASE("python state: AveragedModel refuses a decay outside [0, 1] and a model of another architecture, by name") {
  using namespace dettrial::optim;
  torch::nn::Sequential model(torch::nn::Linear(3, 4));
  CHECK_THROWS_WITH_AS(AveragedModel<torch::nn::Sequential>(model, ema(1.5)),
                       doctest::Contains("AveragedModel: decay must be in [0, 1], not 1.5"), ConfigError);
  AveragedModel<torch::nn::Sequential> averaged(model, ema(0.9));
  torch::nn::Sequential other(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
  CHECK_THROWS_WITH_AS(averaged.update_parameters(other),
                       doctest::Contains("AveragedModel: the model has 4 parameters (and buffers, with use_buffers) but the average 2"),
                       TrialError);
  // A copy given explicitly (for modules that are not Cloneable) starts from the model's values.
  AveragedModel<torch::nn::Sequential> given(torch::nn::Sequential(torch::nn::Linear(3, 4)), model, swa());
  CHECK(torch::equal(given.module()->parameters()[0], model->parameters()[0]));
}

TEST_CASE("python state: update_bn recomputes BatchNorm's statistics as Python's swa_utils.update_bn does") {
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  set_averaging_values(*model, 1);
  std::vector<std::tuple<torch::Tensor, torch::Tensor>> batches;
  for (int b = 0; b < 5; ++b)
    batches.emplace_back(torch::arange(18, torch::kFloat32).mul(0.1 * (b + 1)).remainder(3.0).reshape({6, 3}), torch::zeros({6}));
  model->eval();
  dettrial::optim::update_bn(batches, model);
  CHECK(!model->is_training());  // the mode it had
  auto* bn = model[1]->as<torch::nn::BatchNorm1d>();
  REQUIRE(bn);
  CHECK(bn->options.momentum() == 0.1);  // the momentum it had
  // tests/python/averaging_reference.py's "update_bn", torch 2.15.0. Through a matrix product, whose
  // last bits differ between LibTorch builds: to 1e-6.
  const std::vector<double> mean = {1.0299285650253296, 1.6298571825027466, 2.229785919189453, 1.0440000295639038};
  const std::vector<double> var = {0.29952898621559143, 0.8305804133415222, 1.6276146173477173, 0.3661579489707947};
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(bn->running_mean[static_cast<std::int64_t>(i)].item<double>() == doctest::Approx(mean[i]).epsilon(1e-6));
    CHECK(bn->running_var[static_cast<std::int64_t>(i)].item<double>() == doctest::Approx(var[i]).epsilon(1e-6));
  }
  CHECK(bn->num_batches_tracked.item<std::int64_t>() == 5);
}

namespace {
/// A pickle of protocol 2 calling `module.name` with one text argument (what an attack does).
std::string reduce_call(const std::string& module, const std::string& name, const std::string& argument) {
  std::string text(4, '\0');
  text[0] = static_cast<char>(argument.size());
  return std::string("\x80\x02") + "c" + module + "\n" + name + "\nX" + text + argument + "\x85" + "R.";
}

/// The offset of the central directory entry of record `name` in a zip.
std::size_t central_entry(const std::string& zip, const std::string& name) {
  for (std::size_t at = zip.find("PK\x01\x02"); at != std::string::npos; at = zip.find("PK\x01\x02", at + 4)) {
    const std::size_t length = static_cast<unsigned char>(zip[at + 28]) | (static_cast<unsigned char>(zip[at + 29]) << 8);
    if (zip.compare(at + 46, length, name) == 0) return at;
  }
  FAIL("no central directory entry for " << name);
  return 0;
}

void put32(std::string& bytes, std::size_t at, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

/// A torch.save archive of two tensors, as LibTorch's writer (torch.save's) writes it.
std::string two_tensor_archive() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("w", torch::ones({4}));
  d.insert("b", torch::zeros({2}));
  return dettrial::detail::pickle_archive(d);
}

/// Replaces every occurrence of `from` (the central directory's and the local header's) with `to`, of its length.
std::string renamed(std::string zip, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  for (std::size_t at = zip.find(from); at != std::string::npos; at = zip.find(from, at + 1)) zip.replace(at, from.size(), to);
  return zip;
}

std::string archive_error(const std::string& bytes) {
  try {
    (void)dettrial::detail::unpickle_archive(bytes, "hostile.pth");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "read";
}
}  // namespace

// Each attack on the pickle machine, refused in one line naming it, with nothing run.
TEST_CASE(
    "python pickle: hostile pickles (calls of os.system, builtins.eval, subprocess.Popen, containers that hold themselves, "
    "deep nesting, a value shared 2^40 times) are refused or read in bounded time") {
  for (const auto& [module, name] : {std::pair{"os", "system"}, std::pair{"builtins", "eval"}, std::pair{"subprocess", "Popen"},
                                     std::pair{"posix", "system"}, std::pair{"builtins", "getattr"}}) {
    CAPTURE(name);
    const std::string expected = std::string("'") + module + "." + name + "', which dettrial does not read";
    CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(reduce_call(module, name, "echo")), doctest::Contains(expected.c_str()),
                         std::runtime_error);
  }
  // torch's rebuild function called on something that is not a storage.
  const std::string rebuild = std::string("\x80\x02") + "ctorch._utils\n_rebuild_tensor_v2\n(" + "cos\nsystem\n" + std::string("K\x00", 2) +
                              "K\x01\x85" + "K\x01\x85" + "\x89" + "ccollections\nOrderedDict\n)R" + "tR.";
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(rebuild),
                       doctest::Contains("torch._utils._rebuild_tensor_v2's argument 1 is not a tensor storage"), std::runtime_error);
  // A list and a dict that hold themselves through the memo (l = []; l.append(l)).
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(std::string("\x80\x02]q\x00h\x00"
                                                              "a.",
                                                              9)),
                       doctest::Contains("a list, dict or tuple holds itself"), std::runtime_error);
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(std::string("\x80\x02}q\x00X\x01\x00\x00\x00"
                                                              "ah\x00s.",
                                                              15)),
                       doctest::Contains("a list, dict or tuple holds itself"), std::runtime_error);
  // A dict that holds itself left in the memo, the pickle's value a text (found by the fuzzer).
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(std::string("\x80\x02}q\x00X\x01\x00\x00\x00"
                                                              "ah\x00sX\x07\x00\x00\x00storage.",
                                                              27)),
                       doctest::Contains("a list, dict or tuple holds itself"), std::runtime_error);
  // 1,000 lists each in the last, and 100,000 tuples each in the next (100 KB): refused as they are
  // built, at the 101st level, and freed without a recursion as deep.
  const std::string tuples = std::string("\x80\x02K\x01") + std::string(100000, '\x85') + ".";
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(tuples), doctest::Contains("nested 101 deep, more than the 100 dettrial reads"),
                       std::runtime_error);
  // A cycle made in a list that is then popped off the stack (by a STACK_GLOBAL that refuses it).
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(std::string("\x80\x02]2a]2a\x93.")), doctest::Contains("STACK_GLOBAL"),
                       std::runtime_error);
  std::string deep = "\x80\x02";
  for (int i = 0; i < 1000; ++i) deep += "]";
  for (int i = 0; i < 999; ++i) deep += "a";
  deep += ".";
  CHECK_THROWS_WITH_AS(dettrial::detail::unpickle(deep), doctest::Contains("nested 101 deep, more than the 100 dettrial reads"),
                       std::runtime_error);
  // A tuple of the same tuple twice, 40 times over (2^40 paths to its leaf): read, and searched for
  // unread objects once per container.
  std::string shared = std::string("\x80\x02") + "K\x01";
  for (int i = 0; i < 40; ++i) shared += "q\x00h\x00\x86";
  shared += ".";
  const c10::IValue value = dettrial::detail::unpickle(shared);
  CHECK(!dettrial::detail::python_object_type(value).has_value());
}

// A torch.save archive's zip container, each way it can lie, refused before LibTorch's reader
// trusts it; each refusal one line.
TEST_CASE(
    "python pickle: hostile torch.save archives (path traversal, duplicate names, lying sizes, compression, a truncated "
    "directory, 2^62 elements) are refused in one line before any allocation they ask for") {
  const std::string whole = two_tensor_archive();
  REQUIRE(archive_error(whole) == "read");
  const std::string folder = whole.substr(30, whole.find('/', 30) - 30);  // the first local header's name
  CAPTURE(folder);
  const std::string prefix = "cannot read 'hostile.pth' as a torch.save archive: the zip container";
  CHECK(archive_error(renamed(whole, folder + "/data/1", folder + "/../d/1")) ==
        prefix + "'s record '" + folder + "/../d/1' climbs out of the archive ('..')");
  CHECK(archive_error(renamed(whole, folder + "/data/1", "/" + folder.substr(1) + "/data/1")) ==
        prefix + "'s record '/" + folder.substr(1) + "/data/1' is absolute");
  CHECK(archive_error(renamed(whole, folder + "/data/1", folder + "/data/0")) == prefix + " names record '" + folder + "/data/0' twice");
  std::string compressed = whole;
  compressed[central_entry(whole, folder + "/data/0") + 10] = 8;  // deflate
  CHECK(archive_error(compressed) ==
        prefix + "'s record '" + folder +
            "/data/0' is compressed (method 8): torch.save stores records uncompressed, and a compressed one could inflate to any size");
  std::string disagreeing = whole;
  put32(disagreeing, central_entry(whole, folder + "/data/0") + 20, 1);  // compressed size
  CHECK(archive_error(disagreeing) == prefix + "'s record '" + folder + "/data/0' claims 16 bytes stored in 1");
  std::string huge = whole;
  put32(huge, central_entry(whole, folder + "/data/0") + 20, 0x7fffffff);
  put32(huge, central_entry(whole, folder + "/data/0") + 24, 0x7fffffff);
  CHECK(archive_error(huge) ==
        prefix + "'s record '" + folder + "/data/0' claims 2147483647 bytes, more than the file holds before its central directory");
  const std::size_t directory = whole.find("PK\x01\x02");
  CHECK(archive_error(whole.substr(0, directory + 30)) ==
        "cannot read 'hostile.pth' as a torch.save archive: not a zip container (no end of central directory record: a truncated file?)");
  CHECK(archive_error(whole.substr(0, 10)) ==
        "cannot read 'hostile.pth' as a torch.save archive: not a zip container (shorter than a zip's end record)");
  // A storage of 2^62 elements, asked for by the pickle of a well-formed archive.
  const std::string crafted = with_storage_count(whole, std::string("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40", 10));
  CHECK(archive_error(crafted).find("holds 16 bytes where 4611686018427387904 of 4 bytes are needed") != std::string::npos);
}
