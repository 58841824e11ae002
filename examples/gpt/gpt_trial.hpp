// SPDX-License-Identifier: Apache-2.0
// nanoGPT's training recipe (train.py) as a dettrial trial: AdamW over configure_optimizers' two
// groups (weight decay on the 2-D parameters only), get_lr's warmup and cosine decay stepped every
// batch (a LambdaLR of get_lr / learning_rate), clipping at grad_clip, nanoGPT's random windows of
// the corpus; aggregation, bf16 autocast, ZeRO and the rest come from the experiment config. With
// `optimizer: muon`, the speedrun's split: Muon for the blocks' 2-D matrices, AdamW for the
// embeddings, the head, the norms and the biases (two wrapped optimizers).
//   scripts/gpt-data                   # the corpus: Shakespeare's works, 5 MB of characters
//   gpt --config examples/gpt/cpu.yaml --set data.dir=$HOME/.cache/dettrial/shakespeare
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dettrial/dettrial.hpp>
#include <dettrial/tokens.hpp>

#include "gpt_model.hpp"

namespace gpt {

/// The corpus folder's vocabulary (meta.json, scripts/gpt-data's: vocab_size and the characters).
struct Vocabulary {
  std::int64_t size = 0;
  std::vector<std::string> itos;
  static Vocabulary read(const std::filesystem::path& dir) {
    const std::filesystem::path path = dir / "meta.json";
    std::ifstream in(path);
    if (!in) throw dettrial::DataError("no " + path.string() + ": give data.dir a folder scripts/gpt-data wrote");
    try {
      const nlohmann::json meta = nlohmann::json::parse(in);
      Vocabulary v{meta.at("vocab_size").get<std::int64_t>(), meta.at("itos").get<std::vector<std::string>>()};
      if (v.size <= 0 || static_cast<std::int64_t>(v.itos.size()) != v.size)
        throw dettrial::DataError(path.string() + ": vocab_size " + std::to_string(v.size) + " but " + std::to_string(v.itos.size()) +
                                  " characters");
      return v;
    } catch (const nlohmann::json::exception& e) {
      throw dettrial::DataError(path.string() + " is not scripts/gpt-data's meta.json: " + e.what());
    }
  }
  std::string decode(const torch::Tensor& ids) const {
    std::string text;
    const torch::Tensor c = ids.to(torch::kCPU).to(torch::kLong).contiguous();
    for (std::int64_t i = 0; i < c.numel(); ++i) text += itos.at(static_cast<std::size_t>(c.data_ptr<std::int64_t>()[i]));
    return text;
  }
};

/// nanoGPT's get_lr(it): a linear warmup to learning_rate over warmup_iters, a cosine decay to
/// min_lr at lr_decay_iters, then min_lr; here as the factor of learning_rate a LambdaLR takes.
struct NanoGptSchedule {
  double learning_rate, min_lr;
  std::int64_t warmup_iters, lr_decay_iters;
  double lr(std::int64_t it) const {
    if (it < warmup_iters) return learning_rate * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
    if (it > lr_decay_iters) return min_lr;
    const double decay_ratio = static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
    return min_lr + coeff * (learning_rate - min_lr);
  }
  double factor(std::int64_t it) const { return lr(it) / learning_rate; }
};

inline GPTConfig model_config(const dettrial::Context& context, std::int64_t vocab_size) {
  const auto& h = context.get_hparams();
  GPTConfig c;
  c.block_size = h.get_or<std::int64_t>("block_size", 256);
  // nanoGPT pads GPT-2's 50,257 to 50,304 (a multiple of 64) for speed; ids past the corpus's are never seen.
  c.vocab_size = h.get_or<std::int64_t>("vocab_size", vocab_size);
  if (c.vocab_size < vocab_size)
    throw dettrial::HyperparameterError("vocab_size " + std::to_string(c.vocab_size) + " is smaller than the corpus's vocabulary (" +
                                        std::to_string(vocab_size) + " in meta.json)");
  c.n_layer = h.get_or<std::int64_t>("n_layer", 6);
  c.n_head = h.get_or<std::int64_t>("n_head", 6);
  c.n_embd = h.get_or<std::int64_t>("n_embd", 384);
  c.dropout = h.get_or<double>("dropout", 0.0);
  c.bias = h.get_or<bool>("bias", false);
  if (c.n_embd % c.n_head != 0)
    throw dettrial::HyperparameterError("n_embd (" + std::to_string(c.n_embd) + ") must be a multiple of n_head (" +
                                        std::to_string(c.n_head) + ")");
  return c;
}

class GptTrial {
 public:
  using Batch = std::tuple<torch::Tensor, torch::Tensor>;

  explicit GptTrial(dettrial::Context& context)
      : context_(context),
        dir_(context.get_data_or<std::string>("dir", (default_data_dir()).string())),
        vocabulary_(Vocabulary::read(dir_)),
        model_(context.wrap_model(GPT(model_config(context, vocabulary_.size)))),
        schedule_{context.get_hparams().get_or<double>("learning_rate", 1e-3), context.get_hparams().get_or<double>("min_lr", 1e-4),
                  context.get_hparams().get_or<std::int64_t>("warmup_iters", 100),
                  context.get_hparams().get_or<std::int64_t>("lr_decay_iters", 5000)},
        grad_clip_(context.get_hparams().get_or<double>("grad_clip", 1.0)) {
    model_->checkpoint_blocks = context.get_hparams().get_or<bool>("activation_checkpointing", false);
    for (const auto& [name, p] : model_->unique_named_parameters()) model_params_.push_back(p);
    build_optimizers();
    for (auto& optimizer : optimizers())
      schedulers_.push_back(
          std::make_unique<dettrial::optim::LambdaLR>(*optimizer, [s = schedule_](std::int64_t it) { return s.factor(it); }));
    for (auto& scheduler : schedulers_) context.wrap_lr_scheduler(*scheduler, dettrial::lr_step::every_batch{});
  }

  /// nanoGPT's get_batch('train'): windows at random offsets of train.bin, drawn from the trial's
  /// seed (data.window_seed to choose them).
  auto build_training_data_loader() {
    const dettrial::TokenFile train(dir_ / "train.bin", dettrial::TokenWidth::u16, vocabulary_.size);
    std::optional<std::uint64_t> seed;
    if (const auto s = context_.get_data_or<std::int64_t>("window_seed", -1); s >= 0) seed = static_cast<std::uint64_t>(s);
    return dettrial::DataLoader(
        dettrial::TokenWindows(train, {.block_size = model_->config.block_size, .order = dettrial::WindowOrder::random}),
        {.batch_size = context_.get_per_slot_batch_size(), .seed = seed});
  }
  /// nanoGPT's estimate_loss over 'val': eval_iters batches of random windows of val.bin, the same
  /// ones at every validation (the loader's own seed), so that validations compare.
  auto build_validation_data_loader() {
    const dettrial::TokenFile val(dir_ / "val.bin", dettrial::TokenWidth::u16, vocabulary_.size);
    const std::int64_t batch = context_.get_per_slot_batch_size(), eval_iters = context_.get_data_or<std::int64_t>("eval_iters", 200);
    return dettrial::DataLoader(dettrial::TokenWindows(val, {.block_size = model_->config.block_size,
                                                             .order = dettrial::WindowOrder::random,
                                                             .windows_per_epoch = context_.get_global_batch_size() * eval_iters}),
                                {.batch_size = batch, .seed = 1337});
  }

  dettrial::Metrics train_batch(Batch& batch, std::int64_t /*epoch_idx*/, std::int64_t batch_idx) {
    batches_trained_ = batch_idx + 1;
    auto& [x, y] = batch;
    const torch::Tensor loss = GPTImpl::loss(model_->forward(x.to(context_.device())), y.to(context_.device()));
    context_.backward(loss);
    if (grad_clip_ <= 0) {
      for (auto* optimizer : optimizers()) context_.step_optimizer(*optimizer);
    } else if (!muon_) {
      context_.step_optimizer(*adamw_, ClipInModelOrder{&model_params_, grad_clip_});
    } else {  // each optimizer's gradients are ready (reduced over the ranks) at its own step: clipped there
      for (auto* optimizer : optimizers()) context_.step_optimizer(*optimizer, dettrial::clip::by_norm{grad_clip_});
    }
    return {{"loss", loss}};
  }

  dettrial::Metrics evaluate_batch(Batch& batch) {
    auto& [x, y] = batch;
    return {{"val_loss", GPTImpl::loss(model_->forward(x.to(context_.device())), y.to(context_.device()))}};
  }

  GPT& model() { return model_; }
  const Vocabulary& vocabulary() const { return vocabulary_; }

  /// Text sampled from the model after `prompt` (nanoGPT's sample.py: temperature 0.8, the 200
  /// likeliest), drawn from a generator of `seed`'s, so that sampling leaves the training's draws alone.
  std::string sample(const std::string& prompt, std::int64_t tokens, std::uint64_t seed, double temperature = 0.8,
                     std::int64_t top_k = 200) {
    std::vector<std::int64_t> ids;
    for (const char ch : prompt) {
      const auto it = std::find(vocabulary_.itos.begin(), vocabulary_.itos.end(), std::string(1, ch));
      if (it == vocabulary_.itos.end())
        throw dettrial::DataError(std::string("the prompt's character '") + ch + "' is not in the vocabulary");
      ids.push_back(it - vocabulary_.itos.begin());
    }
    const bool training = model_->is_training();
    model_->eval();
    at::Generator generator = at::detail::createCPUGenerator(seed);
    const torch::Tensor start = torch::tensor(ids, torch::kLong).view({1, -1}).to(context_.device());
    const torch::Tensor out =
        model_->generate(start, tokens, temperature, top_k, context_.device().is_cpu() ? std::optional(generator) : std::nullopt);
    model_->train(training);
    return vocabulary_.decode(out[0]);
  }

  /// At each validation, a few lines the model writes after a newline (the chief's): into
  /// TensorBoard's text dashboard (tag `samples`) and `samples.txt` beside the run's report.
  struct Samples {
    GptTrial* trial;
    void on_validation_end(const dettrial::MetricValues& /*metrics*/) { trial->write_samples(); }
  };
  auto build_callbacks() { return std::tuple{Samples{this}}; }

 private:
  static std::filesystem::path default_data_dir() {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    return (cache && *cache ? std::filesystem::path(cache) : std::filesystem::path(home ? home : "/") / ".cache") / "dettrial" /
           "shakespeare";
  }

  void write_samples() {
    const std::int64_t tokens = context_.get_data_or<std::int64_t>("sample_tokens", 200);
    if (!context_.distributed().is_chief() || tokens <= 0) return;
    const std::string text = sample("\n", tokens, static_cast<std::uint64_t>(batches_trained_));
    context_.get_tensorboard_writer().add_text("samples", "```\n" + text + "\n```", batches_trained_);
    if (const std::filesystem::path tb = context_.get_tensorboard_path(); !tb.empty())
      std::ofstream(tb.parent_path() / "samples.txt", std::ios::app) << "---- batch " << batches_trained_ << "\n" << text << "\n";
  }

  /// nanoGPT's configure_optimizers: AdamW, the parameters of 2 or more dimensions in a group with
  /// weight_decay, the others in one without; with `optimizer: muon`, the blocks' matrices go to Muon.
  void build_optimizers() {
    const auto& h = context_.get_hparams();
    const double lr = schedule_.learning_rate, weight_decay = h.get_or<double>("weight_decay", 0.1);
    const auto betas = std::make_tuple(h.get_or<double>("beta1", 0.9), h.get_or<double>("beta2", 0.95));
    const std::string kind = h.get_or<std::string>("optimizer", "adamw");
    if (kind != "adamw" && kind != "muon") throw dettrial::HyperparameterError("optimizer must be adamw or muon, not '" + kind + "'");
    std::vector<torch::Tensor> decay, no_decay, matrices;
    for (const auto& [name, p] : model_->unique_named_parameters()) {
      const bool block_matrix = p.dim() == 2 && name.starts_with("transformer.h.");
      if (kind == "muon" && block_matrix) matrices.push_back(p);
      else (p.dim() >= 2 ? decay : no_decay).push_back(p);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(
        decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).betas(betas).weight_decay(weight_decay)));
    groups.emplace_back(no_decay,
                        std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).betas(betas).weight_decay(0.0)));
    // nanoGPT's `fused=True` where PyTorch has it (CUDA there; LibTorch 2.4's fused kernels run on
    // the CPU too): dettrial's FusedAdamW, else LibTorch's AdamW (nanoGPT's arithmetic on a CPU).
    if (h.get_or<bool>("fused", true))
      adamw_ = std::make_unique<dettrial::optim::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(lr).betas(betas));
    else adamw_ = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(lr).betas(betas));
    context_.wrap_optimizer(*adamw_);
    if (kind == "muon") {
      muon_ = std::make_unique<dettrial::optim::Muon>(matrices, dettrial::optim::MuonOptions(h.get_or<double>("muon_lr", 0.02))
                                                                    .momentum(h.get_or<double>("muon_momentum", 0.95))
                                                                    .weight_decay(weight_decay));
      context_.wrap_optimizer(*muon_);
    }
  }
  std::vector<torch::optim::Optimizer*> optimizers() {
    std::vector<torch::optim::Optimizer*> out{adamw_.get()};
    if (muon_) out.push_back(muon_.get());
    return out;
  }

  /// nanoGPT's clip_grad_norm_(model.parameters(), grad_clip): the norm of the parameters' norms
  /// summed in the model's order (the optimizer lists them by group, in another order, whose sum
  /// rounds otherwise). The same gradients as the step's: one optimizer holds them all.
  struct ClipInModelOrder {
    std::vector<torch::Tensor>* params;
    double max_norm;
    void operator()(std::vector<torch::Tensor>& /*the optimizer's*/) const { dettrial::clip::by_norm{max_norm}(*params); }
  };

  dettrial::Context& context_;
  std::filesystem::path dir_;
  Vocabulary vocabulary_;
  GPT model_;
  NanoGptSchedule schedule_;
  double grad_clip_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::unique_ptr<dettrial::optim::Muon> muon_;
  std::vector<std::unique_ptr<dettrial::optim::LambdaLR>> schedulers_;
  std::vector<torch::Tensor> model_params_;  // each once, in the model's order
  std::int64_t batches_trained_ = 0;
};

}  // namespace gpt
