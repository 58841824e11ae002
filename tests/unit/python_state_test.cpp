// Python's state in and out: the pickle reader on what Python's pickler writes (NumPy arrays and
// scalars, protocol 2's bytes, OrderedDicts, sets) and on what it must refuse; optimizers and
// schedulers restored from Python's layout exactly, and refused with a sentence naming the part
// when the layout is another type's; NumPy's and Python's generators seeded as Determined seeds them;
// LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR and
// CosineAnnealingWarmRestarts against the learning rates and state dicts Python computes
// (tests/python/scheduler_reference.py prints them).
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

TEST_CASE("python pickle: a storage whose pickle asks for more elements than its record holds is refused before any allocation") {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("w", torch::ones({4}));
  const std::string whole = dettrial::detail::pickle_archive(d);
  std::istringstream in(whole);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  auto [pickled, pickled_size] = reader.getRecord("data.pkl");
  std::string pickle(static_cast<const char*>(pickled.get()), pickled_size);
  // The storage's persistent id ends ('cpu', 4): its element count, 4 as BININT1, becomes 2**40 as
  // LONG1 (4 TiB of floats, which an allocation made first would fail on, with another message).
  const auto device = pickle.find("cpu");
  REQUIRE(device != std::string::npos);
  const auto count = pickle.find(std::string("K\x04", 2), device);
  REQUIRE(count != std::string::npos);
  pickle.replace(count, 2, std::string("\x8a\x06\x00\x00\x00\x00\x00\x01", 8));
  std::string crafted;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, std::size_t n) {
    crafted.append(static_cast<const char*>(data), n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  auto [storage, storage_size] = reader.getRecord("data/0");
  writer.writeRecord("data/0", storage.get(), storage_size);
  writer.writeEndOfFile();
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
                       doctest::Contains("optimizer 0, group 0 has decoupled_weight_decay: True, which LibTorch's Adam does not do "
                                         "(that is AdamW's decoupled weight decay: the trial's optimizer must be torch::optim::AdamW)"),
                       CheckpointError);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(0.01));
  load_optimizer_state_dict(adamw, adamw_state, "optimizer 0");  // what it is for
  StateDict plain_adam = optimizer_state_dict(adam);
  plain_adam.at("param_groups").toList().get(0).toGenericDict().insert_or_assign("decoupled_weight_decay", false);
  load_optimizer_state_dict(adam, plain_adam, "optimizer 0");
  CHECK_THROWS_WITH_AS(load_optimizer_state_dict(adamw, plain_adam, "optimizer 0"),
                       doctest::Contains("has decoupled_weight_decay: False, which LibTorch's AdamW does not do"), CheckpointError);
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
  /// FNV-1a of every group's rate after 0, 1, ..., 300 step() calls.
  std::uint64_t all_rates;
  /// The rates after some numbers of calls.
  std::vector<std::pair<int, std::vector<double>>> samples;
  /// FNV-1a of the rates after 38, ..., 300 calls.
  std::uint64_t rates_after_saved;
  /// pickle.dumps(state_dict(), protocol=2) after 37 calls, or null.
  const char* state;
};
constexpr int reference_steps = 300;
constexpr int saved_at = 37;

// Printed by tests/python/scheduler_reference.py with torch 2.15.0 (CPU).
const std::vector<SchedulerReference>& scheduler_references() {
  // clang-format off: as the script prints it
  static const std::vector<SchedulerReference> references = {
    {"LinearLR(start_factor=0.25, end_factor=0.9, total_iters=40)", {0.1, 0.025}, 0x393a370c549af4ddULL,
     {{0, {0x1.999999999999ap-6, 0x1.999999999999ap-8}}, {1, {0x1.b4395810624ddp-6, 0x1.b4395810624ddp-8}}, {2, {0x1.ced916872b021p-6, 0x1.ced916872b021p-8}}, {39, {0x1.69fbe76c8b439p-4, 0x1.69fbe76c8b439p-6}}, {40, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6}}, {41, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6}}, {300, {0x1.70a3d70a3d70ap-4, 0x1.70a3d70a3d70ap-6}}},
     0xe9140662b2c0e2ddULL,
     "80027d710028580c00000073746172745f666163746f727101473fd0000000000000580a000000656e645f666163746f727102473feccccccccccccd"
     "580b000000746f74616c5f697465727371034b285808000000626173655f6c727371045d710528473fb999999999999a473f9999999999999a65580a"
     "0000006c6173745f65706f636871064b25580b0000005f737465705f636f756e7471074b26580b0000005f69735f696e697469616c710889581a0000"
     "005f6765745f6c725f63616c6c65645f77697468696e5f7374657071098958080000005f6c6173745f6c72710a5d710b28473fb5cac083126e98473f"
     "95cac083126e9865752e"},
    {"LinearLR()", {0.3}, 0xa5022353f91f60a1ULL,
     {{0, {0x1.9999999999999p-4}}, {1, {0x1.1eb851eb851ecp-3}}, {4, {0x1.0a3d70a3d70a5p-2}}, {5, {0x1.3333333333334p-2}}, {6, {0x1.3333333333334p-2}}},
     0, nullptr},
    {"LinearLR(start_factor=1.0, end_factor=0.05, total_iters=200)", {0.3, 0.07}, 0x1d63bb5327dc40ffULL,
     {{0, {0x1.3333333333333p-2, 0x1.1eb851eb851ecp-4}}, {1, {0x1.31bda5119ce07p-2, 0x1.1d5bab21815a1p-4}}, {199, {0x1.0d1b71758e21dp-6, 0x1.f6555c52e72fep-9}}, {200, {0x1.eb851eb851ec1p-7, 0x1.cac083126e99bp-9}}, {201, {0x1.eb851eb851ec1p-7, 0x1.cac083126e99bp-9}}},
     0, nullptr},
    {"ConstantLR(factor=0.4, total_iters=50)", {0.1, 0.025}, 0xe761d906543ba08dULL,
     {{0, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7}}, {1, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7}}, {49, {0x1.47ae147ae147cp-5, 0x1.47ae147ae147cp-7}}, {50, {0x1.999999999999bp-4, 0x1.999999999999bp-6}}, {51, {0x1.999999999999bp-4, 0x1.999999999999bp-6}}},
     0x9c3fcd6a3a958cf5ULL,
     "80027d7100285806000000666163746f727101473fd999999999999a580b000000746f74616c5f697465727371024b325808000000626173655f6c72"
     "7371035d710428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e"
     "7471064b26580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f737465707108895808"
     "0000005f6c6173745f6c7271095d710a28473fa47ae147ae147c473f847ae147ae147c65752e"},
    {"ConstantLR()", {0.3}, 0xf7427000891b996bULL,
     {{0, {0x1.9999999999999p-4}}, {4, {0x1.9999999999999p-4}}, {5, {0x1.3333333333333p-2}}, {6, {0x1.3333333333333p-2}}},
     0, nullptr},
    {"CosineAnnealingLR(T_max=50, eta_min=0.001)", {0.1, 0.025}, 0xf8a2db5fd118e4cbULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {1, {0x1.99332da5339a5p-4, 0x1.993648307c831p-6}}, {49, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10}}, {50, {0x1.0624dd2f1a9fcp-10, 0x1.0624dd2f1a9fcp-10}}, {51, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10}}, {52, {0x1.6c76f2fa8fad6p-10, 0x1.1ef2f1fb94175p-10}}, {100, {0x1.9999999999991p-4, 0x1.9999999999972p-6}}, {151, {0x1.1fbfda489a71cp-10, 0x1.0c59f3c0ec08fp-10}}, {300, {0x1.9999999999996p-4, 0x1.9999999999973p-6}}},
     0xb333fbf79a8d10b9ULL,
     "80027d7100285805000000545f6d617871014b3258070000006574615f6d696e7102473f50624dd2f1a9fc5808000000626173655f6c727371035d71"
     "0428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e7471064b26"
     "580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f7374657071088958080000005f6c"
     "6173745f6c7271095d710a28473f9103804a2668d6473f7399e45a85708265752e"},
    {"CosineAnnealingLR(T_max=7)", {0.3}, 0x658e4e6c6be9551cULL,
     {{0, {0x1.3333333333333p-2}}, {1, {0x1.23fd232f03555p-2}}, {7, {0x0.0p+0}}, {8, {0x1.e6c20085fbbc3p-7}}, {9, {0x1.cea7de049c538p-5}}, {15, {0x1.23fd232f03557p-2}}, {22, {0x1.e6c20085fbbc3p-7}}},
     0, nullptr},
    {"LambdaLR(lr_lambda=[lambda e: 1.0 / (1 + e // 30), lambda e: 0.97 ** e])", {0.1, 0.025}, 0x1ad178d4758b72c5ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {1, {0x1.999999999999ap-4, 0x1.8d4fdf3b645a2p-6}}, {29, {0x1.999999999999ap-4, 0x1.52aa396c6581ap-7}}, {30, {0x1.999999999999ap-5, 0x1.4881470f8b6bdp-7}}, {300, {0x1.29e4129e4129fp-7, 0x1.68cd931fced24p-19}}},
     0x4536e5b89e412799ULL,
     "80027d7100285808000000626173655f6c727371015d710228473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871"
     "034b25580b0000005f737465705f636f756e7471044b26580b0000005f69735f696e697469616c710589581a0000005f6765745f6c725f63616c6c65"
     "645f77697468696e5f7374657071068958080000005f6c6173745f6c7271075d710828473fa999999999999a473f8096d28570b76465580a0000006c"
     "725f6c616d6264617371095d710a284e4e65752e"},
    {"LambdaLR(lr_lambda=lambda e: 0.95 ** e)", {0.3}, 0x8bb56e8cd9263b05ULL,
     {{0, {0x1.3333333333333p-2}}, {1, {0x1.23d70a3d70a3dp-2}}, {2, {0x1.153f7ced91687p-2}}, {300, {0x1.0b669ad82bb31p-24}}},
     0, nullptr},
    {"MultiplicativeLR(lr_lambda=lambda e: 0.5 if e % 25 == 0 else 0.995)", {0.1, 0.025}, 0x5044ae81cea1d482ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {1, {0x1.978d4fdf3b646p-4, 0x1.978d4fdf3b646p-6}}, {24, {0x1.6b2c5bf0c75b2p-4, 0x1.6b2c5bf0c75b2p-6}}, {25, {0x1.6b2c5bf0c75b2p-5, 0x1.6b2c5bf0c75b2p-7}}, {26, {0x1.695b7f522284fp-5, 0x1.695b7f522284fp-7}}, {300, {0x1.82c867f9e6f05p-18, 0x1.82c867f9e6f05p-20}}},
     0x2323b1aef09dcf72ULL,
     "80027d7100285808000000626173655f6c727371015d710228473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871"
     "034b25580b0000005f737465705f636f756e7471044b26580b0000005f69735f696e697469616c710589581a0000005f6765745f6c725f63616c6c65"
     "645f77697468696e5f7374657071068958080000005f6c6173745f6c7271075d710828473fa55f8e4cedc46f473f855f8e4cedc46f65580a0000006c"
     "725f6c616d6264617371095d710a284e4e65752e"},
    {"PolynomialLR(total_iters=120, power=2.0)", {0.1, 0.025}, 0x0dcfe6cd7da97295ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {1, {0x1.92cd414ef6372p-4, 0x1.92cd414ef6372p-6}}, {119, {0x1.d208a5a912dfap-18, 0x1.d208a5a912dfap-20}}, {120, {0x0.0p+0, 0x0.0p+0}}, {121, {0x0.0p+0, 0x0.0p+0}}},
     0xa9d8f229f7f1deddULL,
     "80027d710028580b000000746f74616c5f697465727371014b785805000000706f77657271024740000000000000005808000000626173655f6c7273"
     "71035d710428473fb999999999999a473f9999999999999a65580a0000006c6173745f65706f636871054b25580b0000005f737465705f636f756e74"
     "71064b26580b0000005f69735f696e697469616c710789581a0000005f6765745f6c725f63616c6c65645f77697468696e5f73746570710889580800"
     "00005f6c6173745f6c7271095d710a28473fa87e8558f9669f473f887e8558f9669f65752e"},
    {"PolynomialLR()", {0.3}, 0x72e721570d3b328dULL,
     {{0, {0x1.3333333333333p-2}}, {1, {0x1.eb851eb851eb8p-3}}, {4, {0x1.eb851eb851eb6p-5}}, {5, {0x0.0p+0}}, {6, {0x0.0p+0}}},
     0, nullptr},
    {"PolynomialLR(total_iters=90, power=0.5)", {0.3}, 0x32324a3142c02c86ULL,
     {{0, {0x1.3333333333333p-2}}, {1, {0x1.317d12aa80111p-2}}, {89, {0x1.030dc4ea03a66p-5}}, {90, {0x0.0p+0}}, {91, {0x0.0p+0}}},
     0, nullptr},
    {"CosineAnnealingWarmRestarts(T_0=10, T_mult=2, eta_min=0.0001)", {0.1, 0.025}, 0x704b1bac7ef9b399ULL,
     {{0, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {1, {0x1.8f961e30a3466p-4, 0x1.8f9dd0ea39ecbp-6}}, {9, {0x1.4d8ade945889dp-9, 0x1.73e6dbc22e24ep-11}}, {10, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {11, {0x1.9714c28c89728p-4, 0x1.9716b24827dccp-6}}, {29, {0x1.76d94c5e4c161p-11, 0x1.09956008e0474p-12}}, {30, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {70, {0x1.999999999999ap-4, 0x1.999999999999ap-6}}, {300, {0x1.15d0500dce8fep-10, 0x1.63b38cda90bf7p-12}}},
     0x9b9c46c903365216ULL,
     "80027d7100285803000000545f3071014b0a5803000000545f6971024b285806000000545f6d756c7471034b0258070000006574615f6d696e710447"
     "3f1a36e2eb1c432d5805000000545f63757271054b075808000000626173655f6c727371065d710728473fb999999999999a473f9999999999999a65"
     "580a0000006c6173745f65706f636871084b25580b0000005f737465705f636f756e7471094b00580b0000005f69735f696e697469616c710a89581a"
     "0000005f6765745f6c725f63616c6c65645f77697468696e5f73746570710b8958080000005f6c6173745f6c72710c5d710d28473fb7b736d3243f07"
     "473f97b8a9aafe290165752e"},
    {"CosineAnnealingWarmRestarts(T_0=7)", {0.3}, 0x9a70794adf6fd2daULL,
     {{0, {0x1.3333333333333p-2}}, {1, {0x1.23fd232f03555p-2}}, {6, {0x1.e6c20085fbbccp-7}}, {7, {0x1.3333333333333p-2}}, {8, {0x1.23fd232f03555p-2}}, {300, {0x1.e6c20085fbbccp-7}}},
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

/// An SGD whose groups start at the given learning rates.
struct GroupedSGD {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::SGD> sgd;
  explicit GroupedSGD(const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const double lr : lrs) {
      params.push_back(torch::zeros({1}, torch::requires_grad()));
      groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<torch::optim::SGDOptions>(lr));
    }
    sgd = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs.front()));
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& g : sgd->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
  void set_lrs(const std::vector<double>& lrs) {
    for (std::size_t i = 0; i < lrs.size(); ++i) sgd->param_groups()[i].options().set_lr(lrs[i]);
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

template <class S, class... Args>
AnyScheduler any_scheduler(torch::optim::Optimizer& optimizer, Args&&... args) {
  auto s = std::make_shared<S>(optimizer, std::forward<Args>(args)...);
  return {s,
          [s] { s->step(); },
          [s](c10::impl::GenericDict& d) { s->python_state(d); },
          [s](const c10::impl::GenericDict& d, const std::string& what) { s->load_python_state(d, what); },
          [s] { return s->last_epoch(); },
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

/// The same value, exactly: Python's None, bools, ints, floats (to the bit) and lists of them.
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
  } else {
    FAIL("a Python value of type " << python.tagKind());
  }
}

/// Restores a scheduler of `r`'s type made with other arguments on another optimizer with `restore`,
/// gives the optimizer the rates after 37 calls (its own state carries them in a checkpoint) and steps
/// it to 300: its rates after 38, ..., 300 calls must hash as Python's do.
void check_continues(const SchedulerReference& r, const std::vector<double>& saved_lrs, const std::function<void(AnyScheduler&)>& restore) {
  GroupedSGD fresh(std::vector<double>(r.lrs.size(), 0.5));
  AnyScheduler restored = make_scheduler(other_arguments(r.config), *fresh.sgd);
  restore(restored);
  CHECK(restored.last_epoch() == saved_at);
  fresh.set_lrs(saved_lrs);
  RateHash after;
  for (int k = saved_at + 1; k <= reference_steps; ++k) {
    restored.step();
    after.add(fresh.lrs());
  }
  CHECK(after.value == r.rates_after_saved);
}

}  // namespace

TEST_CASE(
    "python state: LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR and "
    "CosineAnnealingWarmRestarts give Python's learning rates for 300 steps, to the bit") {
  for (const SchedulerReference& r : scheduler_references()) {
    INFO(r.config);
    GroupedSGD g(r.lrs);
    AnyScheduler s = make_scheduler(r.config, *g.sgd);
    RateHash all;
    std::map<int, std::vector<double>> rates;
    for (int k = 0; k <= reference_steps; ++k) {
      if (k > 0) s.step();
      all.add(g.lrs());
      rates[k] = g.lrs();
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
    GroupedSGD g(r.lrs);
    AnyScheduler s = make_scheduler(r.config, *g.sgd);
    for (int k = 0; k < saved_at; ++k) s.step();
    c10::impl::GenericDict ours(c10::StringType::get(), c10::AnyType::get());
    s.python_state(ours);
    for (const auto& entry : python) {
      const std::string key = entry.key().toStringRef();
      INFO("entry " << key);
      REQUIRE(ours.contains(key));
      check_same_python_value(ours.at(key), entry.value());
    }
    for (const auto& entry : ours) CHECK((python.contains(entry.key()) || entry.key().toStringRef() == "verbose"));
    const std::vector<double> saved_lrs = g.lrs();
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.load_python_state(python, "Python's state"); });
    const auto written = dettrial::detail::unpickle_archive(dettrial::detail::pickle_archive(ours), "scheduler").toGenericDict();
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.load_python_state(written, "dettrial's state"); });
    const std::string archived = s.saved();  // and dettrial's own checkpoint entry
    check_continues(r, saved_lrs, [&](AnyScheduler& s2) { s2.restore(archived); });
  }
}

TEST_CASE("python state: the new schedulers refuse a bad argument naming the class, and another type's or a callable's state by entry") {
  using namespace dettrial::optim;
  GroupedSGD g({0.1, 0.2});
  auto& o = *g.sgd;
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
