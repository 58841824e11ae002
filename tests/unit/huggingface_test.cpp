// Hugging Face's files: safetensors read as Hugging Face's own writer wrote them
// (tests/python/huggingface_fixtures.py), written so that its reader loads them, every malformed
// file refused by name, load_weights over a safetensors file and a model directory, and the GPT
// example's model to and from transformers' GPT-2.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dettrial/dettrial.hpp>

#include "huggingface.hpp"
#include "skip.hpp"
#include "source_dir.hpp"

namespace fs = std::filesystem;
using dettrial::CheckpointError;

namespace {

/// The fixtures tests/python/huggingface_fixtures.py wrote (CTest's fixture sets the variable), or why not.
std::optional<fs::path> fixtures(std::string& why) {
  const char* dir = std::getenv("DETTRIAL_HUGGINGFACE_FIXTURES");
  if (!dir || !fs::exists(fs::path(dir) / "manifest.json")) {
    why =
        "no Hugging Face fixtures (tests/python/huggingface_fixtures.py needs PyPI's safetensors and torch: "
        "-DDETTRIAL_TRANSFORMERS_PYTHON)";
    return std::nullopt;
  }
  return fs::path(dir);
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A scratch folder of its own for one case.
fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dettrial-huggingface-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// A safetensors file of `header` (padded as the format pads it) and `data`, byte for byte.
fs::path file_of(const fs::path& dir, const std::string& header, const std::string& data, std::optional<std::uint64_t> length = {}) {
  static int count = 0;
  const fs::path path = dir / ("case" + std::to_string(count++) + ".safetensors");
  const std::uint64_t n = length.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
  return path;
}

std::string refusal(const fs::path& path) {
  try {
    (void)dettrial::read_safetensors(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(read without an error)";
}

/// Whether this LibTorch has a type for the format's dtype `name` (U16, U32, U64 from 2.3, the
/// 8-bit floats from 2.1, their FNUZ kinds from 2.2).
bool has_dtype(const std::string& name) {
  const bool unsigned_ints = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3);
  const bool float8 = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1);
  if (name == "U16" || name == "U32" || name == "U64") return unsigned_ints;
  const bool fnuz = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);
  if (name.ends_with("FNUZ")) return fnuz;
  if (name.starts_with("F8_")) return float8;
  return true;
}

/// The tensors of `read` against the manifest's entries named in `names`: dtype, shape, values.
void check_against_manifest(const dettrial::SafetensorsContents& read, const nlohmann::json& manifest, const std::set<std::string>& names) {
  CHECK(read.tensors.size() == names.size());
  for (const auto& entry : manifest["tensors"]) {
    const std::string name = entry["name"];
    if (!names.contains(name)) continue;
    CAPTURE(name);
    const auto it = read.tensors.find(name);
    REQUIRE(it != read.tensors.end());
    const torch::Tensor t = it->value().toTensor();
    CHECK(t.sizes().vec() == entry["shape"].get<std::vector<std::int64_t>>());
    const torch::Tensor values = (t.is_complex() ? at::real(t) : t).to(torch::kDouble).flatten().contiguous();
    CHECK(std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + values.numel()) ==
          entry["values"].get<std::vector<double>>());
  }
}

}  // namespace

TEST_CASE("safetensors: the files Hugging Face's writer wrote read with every dtype, shape and the metadata") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const nlohmann::json manifest = read_json(*dir / "manifest.json");
  const std::map<std::string, std::string> metadata = manifest["metadata"].get<std::map<std::string, std::string>>();

  const auto common_names = manifest["common"].get<std::set<std::string>>();
  const dettrial::SafetensorsContents common = dettrial::read_safetensors(*dir / "common.safetensors");
  check_against_manifest(common, manifest, common_names);
  CHECK(common.metadata == metadata);
  // The dtypes: LibTorch's types as Python's torch names them.
  const std::map<std::string, c10::ScalarType> types = {{"BOOL", torch::kBool}, {"U8", torch::kByte},         {"I8", torch::kChar},
                                                        {"I16", torch::kShort}, {"F16", torch::kHalf},        {"BF16", torch::kBFloat16},
                                                        {"I32", torch::kInt},   {"F32", torch::kFloat},       {"F64", torch::kDouble},
                                                        {"I64", torch::kLong},  {"C64", torch::kComplexFloat}};
  for (const auto& entry : manifest["tensors"])
    if (common_names.contains(entry["name"].get<std::string>())) {
      CAPTURE(entry["name"].get<std::string>());
      CHECK(std::string(c10::toString(common.tensors.at(entry["name"].get<std::string>()).toTensor().scalar_type())) ==
            c10::toString(types.at(entry["dtype"])));
    }

  // Every dtype of this torch: read where this LibTorch has them all, else refused naming the one it lacks.
  std::set<std::string> all_names, lacking;
  for (const auto& entry : manifest["tensors"]) {
    all_names.insert(entry["name"].get<std::string>());
    if (!has_dtype(entry["dtype"])) lacking.insert(entry["dtype"].get<std::string>());
  }
  if (lacking.empty()) {
    check_against_manifest(dettrial::read_safetensors(*dir / "dtypes.safetensors"), manifest, all_names);
  } else {
    const std::string message = refusal(*dir / "dtypes.safetensors");
    CHECK_MESSAGE(
        std::any_of(lacking.begin(), lacking.end(),
                    [&](const std::string& d) { return message.find("dtype " + d + ", which needs LibTorch") != std::string::npos; }),
        message);
  }

  const dettrial::SafetensorsContents empty = dettrial::read_safetensors(*dir / "empty.safetensors");
  CHECK(empty.tensors.size() == 0);
  CHECK(empty.metadata.empty());
}

TEST_CASE("safetensors: what dettrial writes is laid out as Hugging Face's writer lays it out and its reader loads it") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  const nlohmann::json manifest = read_json(*dir / "manifest.json");
  const bool all_dtypes = [&] {
    for (const auto& entry : manifest["tensors"])
      if (!has_dtype(entry["dtype"])) return false;
    return true;
  }();
  const fs::path source = *dir / (all_dtypes ? "dtypes.safetensors" : "common.safetensors");
  const dettrial::SafetensorsContents read = dettrial::read_safetensors(source);
  const fs::path out = scratch("write") / "written.safetensors";
  dettrial::write_safetensors(out, read.tensors, read.metadata);

  // The data after the header, byte for byte (the same order: larger elements first, then names),
  // and the same header as JSON (its text differs only in the order of the metadata's keys).
  const std::string theirs = file_text(source), ours = file_text(out);
  const auto header_end = [](const std::string& bytes) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    return 8 + n;
  };
  CHECK(header_end(ours) % 8 == 0);
  CHECK(theirs.substr(header_end(theirs)) == ours.substr(header_end(ours)));
  CHECK(nlohmann::json::parse(theirs.substr(8, header_end(theirs) - 8)) == nlohmann::json::parse(ours.substr(8, header_end(ours) - 8)));

  // Hugging Face's reader, on what dettrial wrote.
  nlohmann::json expected = {{"metadata", manifest["metadata"]}, {"tensors", nlohmann::json::array()}};
  for (const auto& entry : manifest["tensors"])
    if (read.tensors.contains(entry["name"].get<std::string>())) expected["tensors"].push_back(entry);
  std::ofstream(out.parent_path() / "expected.json") << expected.dump();
  const std::string python = file_text(*dir / "python.txt");
  const std::string command = "'" + python + "' '" + test::tests_source_dir() + "/python/huggingface_fixtures.py' --check '" +
                              out.string() + "' '" + (out.parent_path() / "expected.json").string() + "'";
  CHECK_MESSAGE(std::system(command.c_str()) == 0, command);

  // A non-contiguous tensor is written as its values; a name the format reserves and a value that
  // is not a tensor are refused.
  dettrial::StateDict strided = dettrial::empty_state_dict();
  strided.insert("t", torch::arange(6, torch::kFloat).reshape({2, 3}).t());
  dettrial::write_safetensors(out, strided);
  CHECK(torch::equal(dettrial::read_safetensors(out).tensors.at("t").toTensor(), torch::arange(6, torch::kFloat).reshape({2, 3}).t()));
  dettrial::StateDict reserved = dettrial::empty_state_dict();
  reserved.insert("__metadata__", torch::zeros({1}));
  CHECK_THROWS_WITH_AS(dettrial::write_safetensors(out, reserved), doctest::Contains("the format's name for the metadata"),
                       CheckpointError);
  dettrial::StateDict number = dettrial::empty_state_dict();
  number.insert("lr", 0.1);
  CHECK_THROWS_WITH_AS(dettrial::write_safetensors(out, number), doctest::Contains("'lr' is a Double, not a tensor"), CheckpointError);
  CHECK(torch::equal(dettrial::read_safetensors(out).tensors.at("t").toTensor(), torch::arange(6, torch::kFloat).reshape({2, 3}).t()));
}

TEST_CASE("safetensors: a malformed or hostile file is refused naming the problem") {
  const fs::path dir = scratch("malformed");
  const std::string f32 = std::string(24, '\0');  // six float zeros
  const auto header = [](const std::string& tensors) { return "{" + tensors + "}"; };
  const std::string ok = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  CHECK(dettrial::read_safetensors(file_of(dir, header(ok), f32)).tensors.size() == 1);

  const auto refused = [&](const fs::path& file, const std::string& expected) {
    const std::string message = refusal(file);
    CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
    CHECK_MESSAGE(message.find(file.string()) != std::string::npos, message);
  };
  {
    const fs::path short_file = dir / "short.safetensors";
    std::ofstream(short_file, std::ios::binary) << "abc";
    refused(short_file, "3 bytes, too short");
  }
  refused(file_of(dir, header(ok), f32, 100'000'001), "over the format's limit of 100000000");
  refused(file_of(dir, header(ok), "", 4096), "only");
  refused(file_of(dir, "[" + ok + "]", f32), "does not begin with '{'");
  refused(file_of(dir, "{\"a\":", f32), "not valid JSON");
  refused(file_of(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},\"a\":7}", f32), "is an integer in the header");
  refused(file_of(dir, header(R"("a":{"dtype":"F17","shape":[2,3],"data_offsets":[0,24]})"), f32),
          "dtype 'F17', which is not a safetensors dtype");
  refused(file_of(dir, header(R"("a":{"dtype":"F4","shape":[48],"data_offsets":[0,24]})"), f32), "4 bits an element");
  refused(file_of(dir, header(R"("a":{"shape":[2,3],"data_offsets":[0,24]})"), f32), "no 'dtype'");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[2,3.5],"data_offsets":[0,24]})"), f32), "'shape' is a number");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]})"), f32), "negative size");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]})"), f32), "multiply past 2^63");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]})"), ""), "multiply past 2^63");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})"), f32.substr(0, 20)), "span 20 bytes");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]})"), f32), "before it begins");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0]})"), f32), "not [begin, end]");
  refused(
      file_of(dir, header(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[4],"data_offsets":[4,20]})"),
              f32.substr(0, 20)),
      "their data_offsets overlap");
  refused(
      file_of(dir, header(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[3],"data_offsets":[12,24]})"),
              f32),
      "4 bytes no tensor covers");
  refused(file_of(dir, header(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]})"), f32), "begins at byte 8 of the data");
  refused(file_of(dir, header(ok), f32.substr(0, 16)), "past its end (16 bytes after the header)");
  refused(file_of(dir, header(ok), f32 + "xyz"), "3 bytes follow the last tensor");
  refused(file_of(dir, header(R"("b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]})"), std::string("\x01\x00\x02", 3)),
          "element 2 is byte 2, neither 0 nor 1");
  refused(file_of(dir, header(R"("__metadata__":{"format":7},)" + ok), f32), "'format' is an integer, not text");
  refused(file_of(dir, header(R"("__metadata__":["pt"],)" + ok), f32), "its __metadata__ is an array");
  // Whitespace after the header, as Hugging Face's writer pads it, and a null __metadata__ are fine.
  CHECK(dettrial::read_safetensors(file_of(dir, header(ok) + "       ", f32)).tensors.size() == 1);
  CHECK(dettrial::read_safetensors(file_of(dir, header(R"("__metadata__":null,)" + ok), f32)).metadata.empty());
}

TEST_CASE("load_weights reads a safetensors file, a model directory and its shards, and says what a directory lacks") {
  torch::manual_seed(3);
  torch::nn::Linear source(4, 3), target(4, 3);
  const fs::path dir = scratch("load_weights");
  dettrial::write_safetensors(dir / "weights.safetensors", dettrial::module_state_dict(*source), {{"format", "pt"}});
  dettrial::load_weights(target, dir / "weights.safetensors");
  CHECK(torch::equal(target->weight, source->weight));
  CHECK(torch::equal(target->bias, source->bias));

  // A model directory as save_pretrained writes it.
  const fs::path pretrained = dir / "pretrained";
  fs::create_directories(pretrained);
  fs::copy_file(dir / "weights.safetensors", pretrained / "model.safetensors");
  torch::nn::Linear from_directory(4, 3);
  dettrial::load_weights(from_directory, pretrained);
  CHECK(torch::equal(from_directory->weight, source->weight));

  // Sharded: the index's weight_map names each tensor's file.
  const fs::path sharded = dir / "sharded";
  fs::create_directories(sharded);
  dettrial::StateDict weight = dettrial::empty_state_dict(), bias = dettrial::empty_state_dict();
  weight.insert("weight", source->weight);
  bias.insert("bias", source->bias);
  dettrial::write_safetensors(sharded / "model-00001-of-00002.safetensors", weight);
  dettrial::write_safetensors(sharded / "model-00002-of-00002.safetensors", bias);
  std::ofstream(sharded / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":64},"weight_map":{"weight":"model-00001-of-00002.safetensors","bias":"model-00002-of-00002.safetensors"}})";
  torch::nn::Linear from_shards(4, 3);
  dettrial::load_weights(from_shards, sharded);
  CHECK(torch::equal(from_shards->weight, source->weight));
  CHECK(torch::equal(from_shards->bias, source->bias));
  // An index that says a tensor is in a file that does not hold it.
  std::ofstream(sharded / "model.safetensors.index.json")
      << R"({"weight_map":{"weight":"model-00001-of-00002.safetensors","bias":"model-00001-of-00002.safetensors"}})";
  CHECK_THROWS_WITH_AS(dettrial::load_weights(from_shards, sharded),
                       doctest::Contains("lists 'bias' in model-00001-of-00002.safetensors, which does not hold it"), CheckpointError);
  std::ofstream(sharded / "model.safetensors.index.json") << R"({"weight_map":{"weight":"../elsewhere.safetensors"}})";
  CHECK_THROWS_WITH_AS(dettrial::load_weights(from_shards, sharded), doctest::Contains("is not the name of a file in"), CheckpointError);

  const fs::path nothing = dir / "nothing";
  fs::create_directories(nothing);
  CHECK_THROWS_WITH_AS(dettrial::load_weights(from_shards, nothing),
                       doctest::Contains("model.safetensors, model.safetensors.index.json or pytorch_model.bin"), CheckpointError);
}

TEST_CASE("GPT-2: a directory transformers' save_pretrained wrote loads into the GPT example's model and gives its logits") {
  std::string why;
  const auto dir = fixtures(why);
  if (!dir) return test::skip(why);
  if (!fs::exists(*dir / "gpt2" / "model.safetensors"))
    return test::skip("the fixtures' Python has no transformers (PyPI's: scripts/test installs it)");
  const auto expected = dettrial::read_safetensors(*dir / "gpt2-logits.safetensors").tensors;
  const torch::Tensor ids = expected.at("ids").toTensor(), logits = expected.at("logits").toTensor();
  for (const std::string folder : {"gpt2", "gpt2-bin"}) {
    CAPTURE(folder);
    const gpt::GPTConfig config = gpt::read_huggingface_config(*dir / folder);
    CHECK(config.gelu_tanh);  // GPT-2's gelu_new
    gpt::GPT model(config);
    gpt::load_huggingface(model, *dir / folder);
    model->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor ours = model->forward(ids);
    MESSAGE(folder << ": largest difference from transformers' logits " << (ours - logits).abs().max().item<double>() << " of "
                   << logits.abs().max().item<double>());
    CHECK(torch::allclose(ours, logits, 1e-4, 1e-5));
  }

  // And back: the model written as a directory, which transformers' from_pretrained loads and
  // computes the same logits with (the example's exact GELU named "gelu" in its config).
  torch::manual_seed(4);
  gpt::GPTConfig own;
  own.block_size = 64, own.vocab_size = 84, own.n_layer = 2, own.n_head = 2, own.n_embd = 32, own.bias = false;
  gpt::GPT model(own);
  model->eval();
  const fs::path out = scratch("gpt2-written");
  gpt::save_huggingface(model, out / "model");
  torch::NoGradGuard no_grad;
  dettrial::StateDict ours = dettrial::empty_state_dict();
  ours.insert("ids", ids);
  ours.insert("logits", model->forward(ids).contiguous());
  dettrial::write_safetensors(out / "logits.safetensors", ours);
  const std::string python = file_text(*dir / "python.txt");
  const std::string command = "'" + python + "' '" + test::tests_source_dir() + "/python/huggingface_fixtures.py' --check-gpt2 '" +
                              (out / "model").string() + "' '" + (out / "logits.safetensors").string() + "'";
  CHECK_MESSAGE(std::system(command.c_str()) == 0, command);
  // Read back here too: the same weights.
  gpt::GPT again(gpt::read_huggingface_config(out / "model"));
  gpt::load_huggingface(again, out / "model");
  CHECK(torch::equal(again->transformer->wte->weight, model->transformer->wte->weight));
  CHECK(torch::equal(again->transformer->h[0]->as<gpt::Block>()->attn->c_attn->weight,
                     model->transformer->h[0]->as<gpt::Block>()->attn->c_attn->weight));
}

TEST_CASE("GPT-2: a config of another model, and weights of another shape, are refused by name") {
  const fs::path dir = scratch("gpt2-bad");
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "vocab_size": 10})";
  CHECK_THROWS_WITH_AS(gpt::read_huggingface_config(dir), doctest::Contains("is a 'llama' model, not GPT-2"), dettrial::ConfigError);
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 10})";
  CHECK_THROWS_WITH_AS(gpt::read_huggingface_config(dir), doctest::Contains("is not a GPT2Config"), dettrial::ConfigError);
  torch::manual_seed(4);
  gpt::GPTConfig small;
  small.block_size = 16, small.vocab_size = 20, small.n_layer = 1, small.n_head = 2, small.n_embd = 8;
  gpt::GPT model(small);
  gpt::save_huggingface(model, dir / "small");
  small.n_embd = 16;
  gpt::GPT wider(small);
  CHECK_THROWS_WITH_AS(gpt::load_huggingface(wider, dir / "small"), doctest::Contains("size mismatch: 'transformer.wte.weight'"),
                       CheckpointError);
}
