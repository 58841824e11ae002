// SPDX-License-Identifier: Apache-2.0
// The GPT example's model to and from Hugging Face's GPT-2 (transformers' GPT2LMHeadModel): a
// directory `save_pretrained` wrote (config.json, model.safetensors or pytorch_model.bin) loads into
// it, names mapped as nanoGPT's from_pretrained maps them (GPT-2's Conv1D weights are stored
// transposed, [in, out]); and the model is written as a directory `from_pretrained` loads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include <dettrial/dettrial.hpp>

#include "gpt_model.hpp"

namespace gpt {

/// The weights transformers' GPT-2 keeps as Conv1D ([in, out]), where this model's Linears hold [out, in].
inline bool conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

/// What this model holds that is not a weight of GPT-2's files: the tied head (the token embedding
/// again) and, on LibTorch 1.13, the attention's causal mask.
inline bool not_in_huggingface_files(const std::string& name) { return name == "lm_head.weight" || name.ends_with(".attn.bias"); }

/// A GPT2Config's config.json as this model's configuration (GPT-2 has biases; `gelu_new` is GELU's
/// tanh approximation). Throws ConfigError naming the file for another model type or a missing field.
inline GPTConfig read_huggingface_config(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  std::ifstream in(path);
  if (!in) throw dettrial::ConfigError("no " + path.string() + " (a transformers model directory has one)");
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("model_type", std::string()) != "gpt2")
      throw dettrial::ConfigError(path.string() + " is a '" + j.value("model_type", std::string("?")) + "' model, not GPT-2 ('gpt2')");
    GPTConfig c;
    c.block_size = j.at("n_positions").get<std::int64_t>();
    c.vocab_size = j.at("vocab_size").get<std::int64_t>();
    c.n_layer = j.at("n_layer").get<std::int64_t>();
    c.n_head = j.at("n_head").get<std::int64_t>();
    c.n_embd = j.at("n_embd").get<std::int64_t>();
    c.dropout = j.value("resid_pdrop", 0.0);
    c.bias = true;
    const std::string activation = j.value("activation_function", std::string("gelu_new"));
    if (activation != "gelu_new" && activation != "gelu" && activation != "gelu_pytorch_tanh")
      throw dettrial::ConfigError(path.string() + ": activation_function '" + activation + "' is not GELU (gelu, gelu_new)");
    c.gelu_tanh = activation != "gelu";
    if (!j.value("n_inner", nlohmann::json()).is_null() && j.at("n_inner").get<std::int64_t>() != 4 * c.n_embd)
      throw dettrial::ConfigError(path.string() + ": n_inner " + j.at("n_inner").dump() + " is not 4 x n_embd, which this model's MLP is");
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw dettrial::ConfigError(path.string() + " is not a GPT2Config: " + e.what());
  }
}

/// Loads the weights of a transformers GPT-2 directory into `model`, strictly (every weight, each of
/// its shape); nothing is changed when something is refused.
inline void load_huggingface(GPT& model, const std::filesystem::path& dir) {
  const dettrial::StateDict theirs = dettrial::read_model_state_dict(dir);
  dettrial::StateDict mapped = dettrial::empty_state_dict();
  for (const auto& entry : dettrial::module_state_dict(*model)) {
    const std::string& name = entry.key().toStringRef();
    if (name == "lm_head.weight") continue;  // the token embedding's, loaded under its own name
    if (not_in_huggingface_files(name)) {
      mapped.insert(name, entry.value());  // the mask: this model's own
      continue;
    }
    const auto it = theirs.find(name);
    if (it == theirs.end()) continue;  // named by load_state_dict as missing
    const torch::Tensor t = it->value().toTensor();
    mapped.insert(name, conv1d_weight(name) ? t.t().contiguous() : t);
  }
  if (const auto wte = mapped.find("transformer.wte.weight"); wte != mapped.end()) mapped.insert("lm_head.weight", wte->value());
  for (const auto& entry : theirs) {  // what GPT-2's files hold that this model has no place for
    const std::string& name = entry.key().toStringRef();
    if (!mapped.contains(name) && !name.ends_with(".attn.masked_bias") && !name.ends_with(".attn.bias")) mapped.insert(name, entry.value());
  }
  dettrial::load_state_dict(*model, mapped, /*strict=*/true, "GPT-2's weights in '" + dir.string() + "'");
}

/// Writes `model` as a directory transformers' `GPT2LMHeadModel.from_pretrained` loads: config.json
/// (a GPT2Config) and model.safetensors (GPT-2's names and layout; biases of zeros for a model built
/// without them, the same function).
inline void save_huggingface(const GPT& model, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const GPTConfig& c = model->config;
  dettrial::StateDict out = dettrial::empty_state_dict();
  for (const auto& entry : dettrial::module_state_dict(*model)) {
    const std::string& name = entry.key().toStringRef();
    if (not_in_huggingface_files(name)) continue;
    const torch::Tensor t = entry.value().toTensor().detach();
    out.insert(name, conv1d_weight(name) ? t.t().contiguous() : t);
    if (!c.bias && name.ends_with(".weight") && !name.starts_with("transformer.wte") && !name.starts_with("transformer.wpe")) {
      const std::int64_t outputs = conv1d_weight(name) ? t.size(0) : t.size(-1);
      out.insert(name.substr(0, name.size() - 6) + "bias", torch::zeros({outputs}, t.options()));
    }
  }
  dettrial::write_safetensors(dir / "model.safetensors", out, {{"format", "pt"}});
  const nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"model_type", "gpt2"},
                                 {"vocab_size", c.vocab_size},
                                 {"n_positions", c.block_size},
                                 {"n_embd", c.n_embd},
                                 {"n_layer", c.n_layer},
                                 {"n_head", c.n_head},
                                 {"n_inner", nullptr},
                                 {"activation_function", c.gelu_tanh ? "gelu_new" : "gelu"},
                                 {"resid_pdrop", c.dropout},
                                 {"embd_pdrop", c.dropout},
                                 {"attn_pdrop", c.dropout},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"initializer_range", 0.02},
                                 {"scale_attn_weights", true},
                                 {"tie_word_embeddings", true},
                                 {"bos_token_id", nullptr},
                                 {"eos_token_id", nullptr},
                                 {"dtype", "float32"}};
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
}

}  // namespace gpt
