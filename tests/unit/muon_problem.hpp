// The problem tests/python/muon_reference.py steps torch.optim.Muon on, for the tests that compare
// dettrial::optim::Muon with it (tests/unit/optim_test.cpp, and from Python's own file,
// tests/unit/mnist_test.cpp); and the hash and state-dict keys the optimizer parity tests compare.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dettrial/dettrial.hpp>

namespace muon_problem {

/// FNV-1a 64 over a tensor's bytes, as the reference scripts hash numpy's `tobytes()`.
/// A reference script's line `{"<configuration>", 0x<hash>ULL, ...}` (tests/python/*_reference.py):
/// the configuration and the hash; nullopt for any other line.
inline std::optional<std::pair<std::string, std::uint64_t>> reference_hash_line(const std::string& line) {
  const auto config_end = line.find("\", 0x");
  if (config_end == std::string::npos) return std::nullopt;
  const auto config_begin = line.find('"') + 1;
  return std::pair{line.substr(config_begin, config_end - config_begin), std::stoull(line.substr(config_end + 5, 16), nullptr, 16)};
}

inline void fnv1a(std::uint64_t& h, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  for (std::size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
}

/// The keys of the first group (less `params`) and of the first parameter's state of an optimizer's
/// state dict in Python's layout, for comparison with the ones Python's state_dict() has.
inline std::pair<std::set<std::string>, std::set<std::string>> python_layout_keys(torch::optim::Optimizer& opt) {
  const auto state = dettrial::optimizer_state_dict(opt);
  std::set<std::string> group_keys, state_keys;
  for (const auto& e : state.at("param_groups").toListRef()[0].toGenericDict())
    if (e.key().toStringRef() != "params") group_keys.insert(e.key().toStringRef());
  for (const auto& e : state.at("state").toGenericDict().at(0).toGenericDict()) state_keys.insert(e.key().toStringRef());
  return {group_keys, state_keys};
}

/// w (3 x 4, wide) and v (5 x 2, tall), starting at ((arange(n) * 0.3) % 2 - 1).
inline std::vector<torch::Tensor> muon_params() {
  const auto start = [](std::int64_t n) { return torch::arange(n, torch::kFloat32).mul(0.3).add(0.0).remainder(2.0).sub(1.0); };
  return {start(12).reshape({3, 4}).requires_grad_(), start(10).reshape({5, 2}).requires_grad_()};
}

/// The script's configurations, by the name it prints.
inline std::unique_ptr<dettrial::optim::Muon> muon_named(const std::string& config, std::vector<torch::Tensor> params) {
  using dettrial::optim::Muon;
  using dettrial::optim::MuonLrAdjustment;
  using dettrial::optim::MuonOptions;
  if (config == "Muon()") return std::make_unique<Muon>(params);
  if (config == "Muon(lr=0.02, weight_decay=0.01, nesterov=False, adjust_lr_fn='match_rms_adamw')")
    return std::make_unique<Muon>(params,
                                  MuonOptions(0.02).weight_decay(0.01).nesterov(false).adjust_lr_fn(MuonLrAdjustment::match_rms_adamw));
  if (config == "Muon(momentum=0.9, eps=1e-05, ns_steps=3, adjust_lr_fn='spectral_unclamped')")
    return std::make_unique<Muon>(params,
                                  MuonOptions().momentum(0.9).eps(1e-5).ns_steps(3).adjust_lr_fn(MuonLrAdjustment::spectral_unclamped));
  if (config == "Muon(lr=0.05, ns_coefficients=(2.0, -1.5, 0.5), adjust_lr_fn='original')")
    return std::make_unique<Muon>(params, MuonOptions(0.05).ns_coefficients({2.0, -1.5, 0.5}).adjust_lr_fn(MuonLrAdjustment::original));
  throw std::logic_error("no Muon configuration " + config);
}

/// Steps `from`, ..., `to` with the script's gradients, hashing both matrices and their momentum
/// buffers after each step (FNV-1a 64) into `h`, as the script does.
inline void muon_steps(torch::optim::Optimizer& opt, std::vector<torch::Tensor>& params, int from, int to, std::uint64_t& h) {
  for (int k = from; k <= to; ++k) {
    for (auto& p : params)
      p.mutable_grad() =
          torch::arange(p.numel(), torch::kFloat32).mul(0.7).add(1.1 * k).remainder(3.0).sub(1.5).div(4.0).reshape(p.sizes());
    opt.step();
    for (auto& p : params) {
      const auto add = [&](const torch::Tensor& t) { fnv1a(h, t); };
      add(p);
      using StateMap = std::remove_cvref_t<decltype(opt.state())>;
      add(static_cast<const dettrial::optim::MuonParamState&>(*opt.state().at(dettrial::detail::optimizer_state_key<StateMap>(p)))
              .momentum_buffer());
    }
  }
}

}  // namespace muon_problem
