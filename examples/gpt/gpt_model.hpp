// SPDX-License-Identifier: Apache-2.0
// nanoGPT's GPT (karpathy/nanoGPT, model.py) written with LibTorch's modules, as a user of dettrial
// writes a model: token and position embeddings, pre-LayerNorm blocks of causal self-attention and
// a 4x GELU MLP, the head tied to the token embedding. Built after the same seed, it holds the
// weights nanoGPT's GPT holds: the modules are made in nanoGPT's order (each drawing what its
// PyTorch constructor draws), then initialised as nanoGPT initialises them (normal 0.02, the
// residual projections 0.02 / sqrt(2 n_layer)). Its state_dict has nanoGPT's names.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <dettrial/nn/activation_checkpoint.hpp>

namespace gpt {

/// nanoGPT's GPTConfig.
struct GPTConfig {
  std::int64_t block_size = 1024;
  std::int64_t vocab_size = 50304;  // GPT-2's 50,257 padded to a multiple of 64
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  std::int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;  // in the Linears and LayerNorms, as GPT-2
  /// GELU's tanh approximation (GPT-2's `gelu_new`, what OpenAI's weights were trained with);
  /// nanoGPT's is the exact GELU.
  bool gelu_tanh = false;
};

/// nanoGPT's LayerNorm: PyTorch's, with the bias optional (`bias=False` has none).
class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl> {
 public:
  LayerNormImpl(std::int64_t n, bool bias) : n_(n), has_bias_(bias) { reset(); }
  void reset() override {
    weight = register_parameter("weight", torch::ones({n_}));
    if (has_bias_) bias = register_parameter("bias", torch::zeros({n_}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::layer_norm(x, {n_}, weight, has_bias_ ? bias : torch::Tensor(), 1e-5); }
  torch::Tensor weight, bias;

 private:
  std::int64_t n_;
  bool has_bias_;
};
TORCH_MODULE(LayerNorm);

/// Whether this LibTorch has scaled_dot_product_attention (2.0 and later): flash and memory-efficient
/// kernels on a GPU, the math path on a CPU. LibTorch 1.13 has not: nanoGPT's own fallback, the
/// masked softmax, with its causal mask as the buffer `bias`.
inline constexpr bool has_sdpa = TORCH_VERSION_MAJOR >= 2;

class CausalSelfAttentionImpl : public torch::nn::Cloneable<CausalSelfAttentionImpl> {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& c) : config_(c) { reset(); }
  void reset() override {
    const auto& c = config_;
    TORCH_CHECK(c.n_embd % c.n_head == 0, "n_embd (", c.n_embd, ") must be a multiple of n_head (", c.n_head, ")");
    c_attn = register_module("c_attn", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)));
    c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)));
    attn_dropout = register_module("attn_dropout", torch::nn::Dropout(c.dropout));
    resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
    if (!has_sdpa)
      mask = register_buffer("bias", torch::tril(torch::ones({c.block_size, c.block_size})).view({1, 1, c.block_size, c.block_size}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = config_.n_head;
    const auto qkv = c_attn->forward(x).split(config_.n_embd, 2);
    const torch::Tensor q = qkv[0].view({B, T, H, C / H}).transpose(1, 2);
    const torch::Tensor k = qkv[1].view({B, T, H, C / H}).transpose(1, 2);
    const torch::Tensor v = qkv[2].view({B, T, H, C / H}).transpose(1, 2);
    torch::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, is_training() ? config_.dropout : 0.0, /*is_causal=*/true);
#else
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(k.size(-1))));
    att = att.masked_fill(mask.narrow(2, 0, T).narrow(3, 0, T) == 0, -std::numeric_limits<float>::infinity());
    att = attn_dropout->forward(torch::softmax(att, -1));
    y = torch::matmul(att, v);
#endif
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return resid_dropout->forward(c_proj->forward(y));
  }
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
  torch::Tensor mask;

 private:
  GPTConfig config_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Cloneable<MLPImpl> {
 public:
  explicit MLPImpl(const GPTConfig& c) : config_(c) { reset(); }
  void reset() override {
    const auto& c = config_;
    c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)));
    gelu = register_module("gelu", torch::nn::GELU(torch::nn::GELUOptions().approximate(c.gelu_tanh ? "tanh" : "none")));
    c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)));
    dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) { return dropout->forward(c_proj->forward(gelu->forward(c_fc->forward(x)))); }
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::GELU gelu{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  explicit BlockImpl(const GPTConfig& c) : config_(c) { reset(); }
  void reset() override {
    ln_1 = register_module("ln_1", LayerNorm(config_.n_embd, config_.bias));
    attn = register_module("attn", CausalSelfAttention(config_));
    ln_2 = register_module("ln_2", LayerNorm(config_.n_embd, config_.bias));
    mlp = register_module("mlp", MLP(config_));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    return x + mlp->forward(ln_2->forward(x));
  }
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(Block);

/// The token embedding, as nn.Embedding makes it (its weight drawn N(0, 1)), sharing its weight with
/// the head: nanoGPT's `transformer.wte.weight = lm_head.weight`.
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(std::int64_t count, std::int64_t dim) : count_(count), dim_(dim) { reset(); }
  void reset() override { weight = register_parameter("weight", torch::empty({count_, dim_}).normal_()); }
  torch::Tensor forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }
  torch::Tensor weight;

 private:
  std::int64_t count_, dim_;
};
TORCH_MODULE(Embedding);

/// The language-model head: a Linear without bias whose weight is the token embedding's (one tensor
/// under two names, as in nanoGPT's state_dict). Made as nn.Linear is made (its kaiming-uniform draw)
/// before it takes the embedding's weight, so the generator advances as nanoGPT's does.
class TiedHeadImpl : public torch::nn::Cloneable<TiedHeadImpl> {
 public:
  explicit TiedHeadImpl(torch::Tensor shared) : shared_(std::move(shared)) { reset(); }
  void reset() override {
    torch::Tensor drawn = torch::empty(shared_.sizes());
    torch::nn::init::kaiming_uniform_(drawn, std::sqrt(5.0));  // nn.Linear's draw, then replaced by the tie
    weight = register_parameter("weight", shared_);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight); }
  torch::Tensor weight;

 private:
  torch::Tensor shared_;
};
TORCH_MODULE(TiedHead);

/// nanoGPT's `transformer` ModuleDict: wte, wpe, drop, h, ln_f.
class TransformerImpl : public torch::nn::Cloneable<TransformerImpl> {
 public:
  explicit TransformerImpl(const GPTConfig& c) : config_(c) { reset(); }
  void reset() override {
    const auto& c = config_;
    wte = register_module("wte", Embedding(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", Embedding(c.block_size, c.n_embd));
    drop = register_module("drop", torch::nn::Dropout(c.dropout));
    h = register_module("h", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c));
    ln_f = register_module("ln_f", LayerNorm(c.n_embd, c.bias));
  }
  Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(Transformer);

class GPTImpl : public torch::nn::Cloneable<GPTImpl> {
 public:
  explicit GPTImpl(const GPTConfig& c) : config(c) { reset(); }

  void reset() override {
    transformer = register_module("transformer", Transformer(config));
    lm_head = register_module("lm_head", TiedHead(transformer->wte->weight));
    init_weights();
  }

  /// The logits of every position (`targets` given: for the loss) or of the last (generation, as
  /// nanoGPT's inference-time shortcut).
  torch::Tensor forward(const torch::Tensor& idx, bool every_position = true) {
    const std::int64_t t = idx.size(1);
    TORCH_CHECK(t <= config.block_size, "cannot forward a sequence of ", t, " tokens: the block size is ", config.block_size);
    const torch::Tensor pos = torch::arange(0, t, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
    torch::Tensor x = transformer->drop->forward(transformer->wte->forward(idx) + transformer->wpe->forward(pos));
    const bool checkpointed = checkpoint_blocks && is_training() && torch::GradMode::is_enabled();
    for (const auto& module : *transformer->h) {
      auto block = std::dynamic_pointer_cast<BlockImpl>(module);
      if (checkpointed) {
        const auto run = [block](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{block->forward(in[0])}; };
        x = dettrial::nn::checkpoint(run, {x}, block->parameters()).front();
      } else {
        x = block->forward(x);
      }
    }
    x = transformer->ln_f->forward(x);
    if (!every_position) x = x.narrow(1, t - 1, 1);
    return lm_head->forward(x);
  }

  /// nanoGPT's loss: cross-entropy over every position (ids of -1 ignored).
  static torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.view({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  }

  /// nanoGPT's generate: `max_new_tokens` ids sampled one at a time from the softmax of the last
  /// logits over `temperature`, among the `top_k` likeliest when given (0: all), drawn from
  /// `generator` (unset: LibTorch's default one, as nanoGPT draws from torch's).
  torch::Tensor generate(torch::Tensor idx, std::int64_t max_new_tokens, double temperature = 1.0, std::int64_t top_k = 0,
                         std::optional<at::Generator> generator = std::nullopt) {
    torch::NoGradGuard no_grad;
    for (std::int64_t i = 0; i < max_new_tokens; ++i) {
      const torch::Tensor context =
          idx.size(1) <= config.block_size ? idx : idx.narrow(1, idx.size(1) - config.block_size, config.block_size);
      torch::Tensor logits = forward(context, /*every_position=*/false).select(1, 0) / temperature;
      if (top_k > 0) {
        const torch::Tensor kth =
            std::get<0>(logits.topk(std::min(top_k, logits.size(-1)))).narrow(1, -1 + std::min(top_k, logits.size(-1)), 1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      // c10::optional, which is not std::optional before LibTorch 2.4.
      const c10::optional<at::Generator> drawn_from = generator ? c10::optional<at::Generator>(*generator) : c10::nullopt;
      idx = torch::cat({idx, at::multinomial(torch::softmax(logits, -1), 1, /*replacement=*/false, drawn_from)}, 1);
    }
    return idx;
  }

  /// The parameters, each once (the tied weight appears under two names).
  std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    std::set<const void*> seen;
    for (const auto& p : named_parameters())
      if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
    return out;
  }

  GPTConfig config;
  /// Activation checkpointing per block (the config's `activation_checkpointing`).
  bool checkpoint_blocks = false;
  Transformer transformer{nullptr};
  TiedHead lm_head{nullptr};

 private:
  /// nanoGPT's `self.apply(self._init_weights)` (children before their parent, in order: every
  /// Linear's weight N(0, 0.02) and bias zero, every Embedding N(0, 0.02), the tied weight drawn
  /// again as the head's), then the residual projections again at 0.02 / sqrt(2 n_layer).
  void init_weights() {
    torch::NoGradGuard no_grad;
    const auto linear = [](torch::nn::Linear& l) {
      torch::nn::init::normal_(l->weight, 0.0, 0.02);
      if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
    };
    torch::nn::init::normal_(transformer->wte->weight, 0.0, 0.02);
    torch::nn::init::normal_(transformer->wpe->weight, 0.0, 0.02);
    for (const auto& module : *transformer->h) {
      auto block = std::dynamic_pointer_cast<BlockImpl>(module);
      linear(block->attn->c_attn);
      linear(block->attn->c_proj);
      linear(block->mlp->c_fc);
      linear(block->mlp->c_proj);
    }
    torch::nn::init::normal_(lm_head->weight, 0.0, 0.02);
    const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
    for (const auto& module : *transformer->h) {
      auto block = std::dynamic_pointer_cast<BlockImpl>(module);
      torch::nn::init::normal_(block->attn->c_proj->weight, 0.0, residual);
      torch::nn::init::normal_(block->mlp->c_proj->weight, 0.0, residual);
    }
  }
};
TORCH_MODULE(GPT);

}  // namespace gpt
