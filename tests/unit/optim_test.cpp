// dettrial::optim: Adadelta, NAdam, RAdam, Adamax and the LR schedulers with Python's semantics
// (StepLR, MultiStepLR, ExponentialLR, ReduceLROnPlateau) against Python's own numbers; exact resume
// through save/load; Python's state-dict layout; the one-sentence errors; and dettrial::nn's
// activation checkpointing against the plain run.
//
// Every hard-coded reference value here was printed by tests/python/optim_reference.py, which runs
// torch.optim.Adadelta and torch.optim.lr_scheduler on the same problems (run it to regenerate them),
// here with torch 2.15.0 (the PyPI wheel). Everything runs on the CPU. Learning rates are double
// arithmetic identical to Python's, so they are compared exactly, and torch 1.13.1 (Debian) prints the
// same ones. The Adadelta values are float32 through a matrix product whose BLAS differs between
// builds: torch 1.13.1 prints the same values to about 1e-8 (the last float32 bit), so parameters are
// compared to 1e-6 and the running averages (of order 1e-6 to 1) to 1e-5 relative.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// LibTorch before doctest (as the precompiled header has it): Debian's LibTorch brings glog, whose
// CHECK macro must not be the one the test cases use.
#include <dettrial/dettrial.hpp>
#include <dettrial/optim/adadelta.hpp>
#include <dettrial/optim/muon.hpp>
#include <dettrial/optim/schedulers.hpp>

#include <doctest/doctest.h>

#include "muon_problem.hpp"
#include "source_dir.hpp"

using dettrial::optim::Adadelta;
using dettrial::optim::AdadeltaOptions;
using dettrial::optim::AdadeltaParamState;
using dettrial::optim::ExponentialLR;
using dettrial::optim::MultiStepLR;
using dettrial::optim::ReduceLROnPlateau;
using dettrial::optim::ReduceLROnPlateauOptions;
using dettrial::optim::StepLR;

namespace {

/// The reference problem (optim_reference.py's `problem`): Linear(3, 2) with fixed weights, a batch
/// of 4, MSE loss.
struct Problem {
  torch::nn::Linear model{3, 2};
  torch::Tensor x = torch::arange(12, torch::kFloat).reshape({4, 3}) * 0.25 - 1.0;
  torch::Tensor y = torch::arange(8, torch::kFloat).reshape({4, 2}) * 0.3 - 1.0;
  Problem() {
    torch::NoGradGuard no_grad;
    model->weight.copy_((torch::arange(6, torch::kFloat).reshape({2, 3}) - 2.5) * 0.2);
    model->bias.copy_(torch::tensor({0.1f, -0.2f}));
  }
  void train_step(torch::optim::Optimizer& opt, double sign = 1.0) {
    opt.zero_grad();
    (sign * torch::mse_loss(model->forward(x), y)).backward();
    opt.step();
  }
};

void check_close(const torch::Tensor& t, const std::vector<double>& expected, double epsilon, double scale) {
  const torch::Tensor flat = t.detach().flatten().to(torch::kDouble).contiguous();
  REQUIRE(static_cast<std::size_t>(flat.numel()) == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("element " << i);
    CHECK(flat[static_cast<std::int64_t>(i)].item<double>() == doctest::Approx(expected[i]).epsilon(epsilon).scale(scale));
  }
}
/// Parameters: to 1e-6 (plus 1e-6 relative).
void check_params(const torch::Tensor& t, const std::vector<double>& expected) { check_close(t, expected, 1e-6, 1.0); }
/// State of order 1e-6: 1e-5 relative.
void check_relative(const torch::Tensor& t, const std::vector<double>& expected) { check_close(t, expected, 1e-5, 0.0); }

const AdadeltaParamState& state_of(Adadelta& opt, const torch::Tensor& p) {
  using StateMap = std::remove_cvref_t<decltype(opt.state())>;
  const auto it = opt.state().find(dettrial::detail::optimizer_state_key<StateMap>(p));
  REQUIRE(it != opt.state().end());
  return static_cast<const AdadeltaParamState&>(*it->second);
}

/// An optimizer (Adadelta: schedulers touch only the learning rates) with one group per rate.
struct Groups {
  std::vector<torch::Tensor> params;
  std::unique_ptr<Adadelta> opt;
  explicit Groups(const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const double lr : lrs) {
      params.push_back(torch::zeros({1}, torch::requires_grad()));
      groups.emplace_back(std::vector<torch::Tensor>{params.back()}, std::make_unique<AdadeltaOptions>(lr));
    }
    opt = std::make_unique<Adadelta>(groups, AdadeltaOptions(lrs.front()));
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& g : opt->param_groups()) out.push_back(g.options().get_lr());
    return out;
  }
};

template <class T>
std::string saved(const T& thing) {
  torch::serialize::OutputArchive archive;
  thing.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

template <class T>
void restore(T& thing, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  thing.load(archive);
}

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

const c10::IValue& entry(const c10::impl::GenericDict& d, const std::string& key) {
  const auto it = d.find(key);
  REQUIRE_MESSAGE(it != d.end(), "no key '" << key << "'");
  return it->value();
}

std::vector<double> doubles(const c10::IValue& list) {
  std::vector<double> out;
  for (const c10::IValue& v : list.toList()) out.push_back(v.toDouble());
  return out;
}

/// The keys Python's state_dict() has (torch 2.15's; plus `verbose`, torch 1.13's) are all there,
/// keys are strings, and values are what Python's weights-only loader takes.
void check_python_layout(const c10::impl::GenericDict& d, const std::vector<std::string>& python_keys) {
  for (const auto& key : python_keys) CHECK_MESSAGE(d.contains(key), "no key '" << key << "'");
  CHECK(d.contains("verbose"));
  for (const auto& item : d) {
    CHECK(item.key().isString());
    const c10::IValue& v = item.value();
    CHECK((v.isInt() || v.isDouble() || v.isBool() || v.isString() || v.isNone() || v.isList() || v.isGenericDict()));
    if (v.isList())
      for (const c10::IValue& e : v.toList()) CHECK((e.isInt() || e.isDouble()));
  }
}

}  // namespace

// --------------------------------------------------------------------------------------------------
// (a) Adadelta against torch.optim.Adadelta

TEST_CASE("Adadelta: Python's torch.optim.Adadelta, 5 steps with the default options") {
  Problem p;
  Adadelta opt(p.model->parameters());
  CHECK(static_cast<const AdadeltaOptions&>(opt.defaults()) == AdadeltaOptions().lr(1.0).rho(0.9).eps(1e-6).weight_decay(0));
  for (int i = 0; i < 5; ++i) p.train_step(opt);
  // optim_reference.py: adadelta defaults {}
  check_params(p.model->weight, {-0.48369351029396057, -0.2837192118167877, -0.08374454081058502, 0.08573387563228607, 0.2859362065792084,
                                 0.4861019551753998});
  check_params(p.model->bias, {0.11196325719356537, -0.2121884524822235});
  const AdadeltaParamState& s = state_of(opt, p.model->weight);
  CHECK(s.step() == 5);
  check_relative(s.square_avg(), {0.5733513832092285, 0.5790260434150696, 0.5847324728965759, 0.0014768812106922269, 0.0017984879668802023,
                                  0.002152632921934128});
  check_relative(s.acc_delta(), {4.3788404582301155e-06, 4.3633958739519585e-06, 4.348170023149578e-06, 3.272988351454842e-06,
                                 3.1768829558131984e-06, 3.0999831324152183e-06});
}

TEST_CASE("Adadelta: Python's torch.optim.Adadelta, 5 steps with lr=0.5, rho=0.8, weight_decay=0.01") {
  Problem p;
  Adadelta opt(p.model->parameters(), AdadeltaOptions(0.5).rho(0.8).weight_decay(0.01));
  for (int i = 0; i < 5; ++i) p.train_step(opt);
  // optim_reference.py: adadelta tuned {'lr': 0.5, 'rho': 0.8, 'weight_decay': 0.01}
  check_params(p.model->weight, {-0.49395817518234253, -0.2939615547657013, -0.09396488964557648, 0.09420670568943024, 0.29422318935394287,
                                 0.4942359924316406});
  check_params(p.model->bias, {0.10552938282489777, -0.2055204063653946});
  const AdadeltaParamState& s = state_of(opt, p.model->weight);
  CHECK(s.step() == 5);
  check_relative(s.square_avg(), {0.9652398228645325, 0.974751889705658, 0.9843115210533142, 0.0032418190967291594, 0.004235943779349327,
                                  0.005362918600440025});
  check_relative(s.acc_delta(), {4.0439917938783765e-06, 4.038285624119453e-06, 4.032646756968461e-06, 3.6396463656274136e-06,
                                 3.6136377730144886e-06, 3.593484734665253e-06});

  // Python's state-dict layout of the same run (optim_reference.py: step 5.0, a float32 tensor; the
  // group keys less params).
  c10::impl::GenericDict state = new_dict();
  dettrial::optim::python_layout<dettrial::optim::Adadelta>::write_state(s, state);
  const torch::Tensor step = entry(state, "step").toTensor();
  CHECK(step.dim() == 0);
  CHECK((step.scalar_type() == torch::kFloat));
  CHECK(step.item<float>() == 5.0f);
  CHECK(torch::equal(entry(state, "square_avg").toTensor(), s.square_avg()));
  CHECK(torch::equal(entry(state, "acc_delta").toTensor(), s.acc_delta()));
  c10::impl::GenericDict group = new_dict();
  dettrial::optim::python_layout<dettrial::optim::Adadelta>::write_options(
      static_cast<const AdadeltaOptions&>(opt.param_groups()[0].options()), group);
  std::set<std::string> keys;
  for (const auto& item : group) keys.insert(item.key().toStringRef());
  CHECK(keys == std::set<std::string>{"capturable", "differentiable", "eps", "foreach", "lr", "maximize", "rho", "weight_decay"});
  CHECK(entry(group, "lr").toDouble() == 0.5);
  CHECK(entry(group, "rho").toDouble() == 0.8);
  CHECK(entry(group, "eps").toDouble() == 1e-6);
  CHECK(entry(group, "weight_decay").toDouble() == 0.01);
  CHECK(entry(group, "maximize").toBool() == false);
  CHECK(entry(group, "foreach").isNone());
}

TEST_CASE("Adadelta: maximize is minimizing the negated loss, bit for bit (CPU)") {
  Problem up, down;
  Adadelta maximizing(up.model->parameters(), AdadeltaOptions(0.5).weight_decay(0.01).maximize(true));
  Adadelta minimizing(down.model->parameters(), AdadeltaOptions(0.5).weight_decay(0.01));
  for (int i = 0; i < 3; ++i) {
    up.train_step(maximizing, -1.0);
    down.train_step(minimizing);
  }
  CHECK(torch::equal(up.model->weight, down.model->weight));
  CHECK(torch::equal(up.model->bias, down.model->bias));
}

TEST_CASE("Adadelta: a parameter without a gradient has no state and does not move, the closure's loss is returned") {
  torch::Tensor used = torch::ones({2}, torch::requires_grad()), unused = torch::ones({2}, torch::requires_grad());
  Adadelta opt(std::vector<torch::Tensor>{used, unused});
  const torch::Tensor loss = opt.step([&] {
    opt.zero_grad();
    torch::Tensor l = (used * used).sum();
    l.backward();
    return l;
  });
  CHECK(loss.item<float>() == 2.0f);
  CHECK(opt.state().size() == 1);
  CHECK(torch::equal(unused, torch::ones({2})));
  CHECK_FALSE(torch::equal(used, torch::ones({2})));
}

// --------------------------------------------------------------------------------------------------
// (b) StepLR, MultiStepLR, ExponentialLR against torch.optim.lr_scheduler

TEST_CASE("StepLR: Python's learning rates after 0..6 step() calls, per group") {
  Groups g({1.0, 0.3});
  StepLR sched(*g.opt, 2, 0.5);
  // optim_reference.py: StepLR(step_size=2, gamma=0.5)
  const std::vector<std::vector<double>> python = {{1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125}, {0.3, 0.3, 0.15, 0.15, 0.075, 0.075, 0.0375}};
  for (std::size_t k = 0; k <= 6; ++k) {
    INFO("after " << k << " step() calls");
    if (k > 0) sched.step();
    CHECK(sched.last_epoch() == static_cast<std::int64_t>(k));
    CHECK(sched.get_last_lr() == std::vector<double>{python[0][k], python[1][k]});
    CHECK(g.lrs() == sched.get_last_lr());
  }
  CHECK(sched.base_lrs() == std::vector<double>{1.0, 0.3});
}

TEST_CASE("MultiStepLR: Python's learning rates after 0..7 step() calls, a repeated milestone decays by gamma squared") {
  Groups g({1.0});
  MultiStepLR sched(*g.opt, {2, 5, 5}, 0.1);
  // optim_reference.py: MultiStepLR(milestones=[2, 5, 5], gamma=0.1)
  const std::vector<double> python = {1.0, 1.0, 0.1, 0.1, 0.1, 0.0010000000000000002, 0.0010000000000000002, 0.0010000000000000002};
  for (std::size_t k = 0; k < python.size(); ++k) {
    INFO("after " << k << " step() calls");
    if (k > 0) sched.step();
    CHECK(sched.get_last_lr() == std::vector<double>{python[k]});
    CHECK(g.lrs() == sched.get_last_lr());
  }
}

TEST_CASE("ExponentialLR: Python's learning rates after 0..6 step() calls, to the last bit") {
  Groups g({0.1});
  ExponentialLR sched(*g.opt, 0.9);
  // optim_reference.py: ExponentialLR(gamma=0.9)
  const std::vector<double> python = {
      0.1, 0.09000000000000001, 0.08100000000000002, 0.07290000000000002, 0.06561000000000002, 0.05904900000000002, 0.05314410000000002};
  for (std::size_t k = 0; k < python.size(); ++k) {
    INFO("after " << k << " step() calls");
    if (k > 0) sched.step();
    CHECK(sched.get_last_lr() == std::vector<double>{python[k]});
    CHECK(g.lrs() == sched.get_last_lr());
  }
}

// --------------------------------------------------------------------------------------------------
// (c) ReduceLROnPlateau against torch.optim.lr_scheduler.ReduceLROnPlateau

namespace {

struct PlateauReference {
  std::vector<double> metrics;
  std::vector<std::vector<double>> lrs;  // per group, after each step
  std::vector<double> best;
  std::vector<std::int64_t> num_bad_epochs, cooldown_counter;
};

// optim_reference.py: ReduceLROnPlateau min/rel {'mode': 'min', 'factor': 0.5, 'patience': 2,
// 'threshold': 0.1, 'cooldown': 1, 'min_lr': 0.02}. Patience, the relative threshold (0.95 is no
// improvement on 1.0), cooldown, min_lr (0.025 -> 0.02) and a drop to min_lr that is no drop.
const PlateauReference min_rel{{1.0, 0.95, 0.95, 0.95, 0.85, 0.8, 0.8, 0.8, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5},
                               {{0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.025, 0.02, 0.02, 0.02, 0.02, 0.02}},
                               {1.0, 1.0, 1.0, 1.0, 0.85, 0.85, 0.85, 0.85, 0.85, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5},
                               {0, 1, 2, 0, 0, 1, 2, 0, 0, 0, 1, 2, 0, 0, 1, 2, 0},
                               {0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1}};
ReduceLROnPlateauOptions min_rel_options() {
  return {.mode = "min", .factor = 0.5, .patience = 2, .threshold = 0.1, .cooldown = 1, .min_lr = 0.02};
}

// optim_reference.py: ReduceLROnPlateau max/abs {'mode': 'max', 'factor': 0.1, 'patience': 1,
// 'threshold': 0.05, 'threshold_mode': 'abs', 'min_lr': [0.001, 0.05], 'eps': 0.02}. Per-group
// min_lr, the absolute threshold, and eps (the second drop of group 0, 0.01 -> 0.001, is under it).
const PlateauReference max_abs{{0.5, 0.52, 0.56, 0.6, 0.58, 0.61, 0.7, 0.69, 0.68, 0.67, 0.66, 0.65},
                               {{0.1, 0.1, 0.1, 0.1, 0.010000000000000002, 0.010000000000000002, 0.010000000000000002, 0.010000000000000002,
                                 0.010000000000000002, 0.010000000000000002, 0.010000000000000002, 0.010000000000000002},
                                {0.5, 0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05}},
                               {0.5, 0.5, 0.56, 0.56, 0.56, 0.56, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7},
                               {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1},
                               {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
ReduceLROnPlateauOptions max_abs_options() {
  return {.mode = "max",
          .factor = 0.1,
          .patience = 1,
          .threshold = 0.05,
          .threshold_mode = "abs",
          .min_lr = std::vector<double>{0.001, 0.05},
          .eps = 0.02};
}

void check_plateau_step(const ReduceLROnPlateau& sched, const Groups& g, const PlateauReference& ref, std::size_t i) {
  INFO("after step " << i + 1 << " (metric " << ref.metrics[i] << ")");
  std::vector<double> lrs;
  for (const auto& group : ref.lrs) lrs.push_back(group[i]);
  CHECK(sched.get_last_lr() == lrs);
  CHECK(g.lrs() == lrs);
  CHECK(sched.best() == ref.best[i]);
  CHECK(sched.num_bad_epochs() == ref.num_bad_epochs[i]);
  CHECK(sched.cooldown_counter() == ref.cooldown_counter[i]);
  CHECK(sched.last_epoch() == static_cast<std::int64_t>(i + 1));
}

}  // namespace

TEST_CASE("ReduceLROnPlateau: Python's rules, min mode with a relative threshold, cooldown and min_lr") {
  Groups g({0.1});
  ReduceLROnPlateau sched(*g.opt, min_rel_options());
  CHECK(sched.best() == std::numeric_limits<double>::infinity());  // Python's mode_worse
  CHECK(sched.last_epoch() == 0);
  CHECK(sched.get_last_lr() == std::vector<double>{0.1});
  for (std::size_t i = 0; i < min_rel.metrics.size(); ++i) {
    sched.step(min_rel.metrics[i]);
    check_plateau_step(sched, g, min_rel, i);
  }
}

TEST_CASE("ReduceLROnPlateau: Python's rules, max mode with an absolute threshold, per-group min_lr and eps") {
  Groups g({0.1, 0.5});
  ReduceLROnPlateau sched(*g.opt, max_abs_options());
  CHECK(sched.best() == -std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i < max_abs.metrics.size(); ++i) {
    sched.step(torch::tensor(max_abs.metrics[i], torch::kDouble));  // a 0-dim tensor metric, as Python takes it
    check_plateau_step(sched, g, max_abs, i);
  }
}

// --------------------------------------------------------------------------------------------------
// (d) save/load: exact resume

TEST_CASE("save/load: Adadelta and StepLR saved after 2 steps and loaded into fresh ones continue identically") {
  Problem run;
  Adadelta opt(run.model->parameters(), AdadeltaOptions(0.5).rho(0.8).weight_decay(0.01));
  StepLR sched(opt, 2, 0.5);
  for (int i = 0; i < 2; ++i) {
    run.train_step(opt);
    sched.step();
  }
  const std::string opt_bytes = saved(opt), sched_bytes = saved(sched);

  // Fresh ones, made with other options: load restores Python's whole state, options included.
  Problem resumed;
  {
    torch::NoGradGuard no_grad;
    resumed.model->weight.copy_(run.model->weight);
    resumed.model->bias.copy_(run.model->bias);
  }
  Adadelta opt2(resumed.model->parameters());
  StepLR sched2(opt2, 7, 0.9);
  restore(opt2, opt_bytes);
  restore(sched2, sched_bytes);
  CHECK(static_cast<const AdadeltaOptions&>(opt2.param_groups()[0].options()) ==
        static_cast<const AdadeltaOptions&>(opt.param_groups()[0].options()));
  CHECK(sched2.step_size() == 2);
  CHECK(sched2.gamma() == 0.5);
  CHECK(sched2.last_epoch() == 2);
  CHECK(sched2.step_count() == 3);
  CHECK(state_of(opt2, resumed.model->weight) == state_of(opt, run.model->weight));

  for (int i = 0; i < 3; ++i) {
    run.train_step(opt);
    sched.step();
    resumed.train_step(opt2);
    sched2.step();
    CHECK(torch::equal(run.model->weight, resumed.model->weight));
    CHECK(torch::equal(run.model->bias, resumed.model->bias));
    CHECK(sched2.get_last_lr() == sched.get_last_lr());
    CHECK(sched2.last_epoch() == sched.last_epoch());
  }
  CHECK(sched.get_last_lr() == std::vector<double>{0.125});  // Python's StepLR after 5 calls from lr 0.5
}

TEST_CASE("save/load: MultiStepLR and ExponentialLR resume exactly, a scheduler of another type is refused") {
  Groups a({1.0}), b({1.0});
  MultiStepLR multi(*a.opt, {2, 5, 5}, 0.1);
  multi.step();
  multi.step();
  MultiStepLR multi2(*b.opt, {1}, 0.5);
  restore(multi2, saved(multi));
  b.opt->param_groups()[0].options().set_lr(a.lrs()[0]);  // the optimizer's own state holds its rate
  CHECK(multi2.milestones() == std::map<std::int64_t, std::int64_t>{{2, 1}, {5, 2}});
  for (int i = 0; i < 5; ++i) {
    multi.step();
    multi2.step();
    CHECK(multi2.get_last_lr() == multi.get_last_lr());
    CHECK(b.lrs() == a.lrs());
  }

  Groups c({0.1}), d({0.1});
  ExponentialLR expo(*c.opt, 0.9);
  expo.step();
  ExponentialLR expo2(*d.opt, 0.5);
  restore(expo2, saved(expo));
  d.opt->param_groups()[0].options().set_lr(c.lrs()[0]);
  expo.step();
  expo2.step();
  CHECK(expo2.get_last_lr() == expo.get_last_lr());
  CHECK(expo2.get_last_lr() == std::vector<double>{0.08100000000000002});

  CHECK_THROWS_WITH_AS(restore(expo2, saved(multi)), doctest::Contains("ExponentialLR's saved state was written by a MultiStepLR"),
                       dettrial::CheckpointError);
  CHECK(expo2.last_epoch() == 2);  // left as it was
}

TEST_CASE("save/load: ReduceLROnPlateau saved midway (and fresh, best = inf) resumes exactly") {
  Groups g({0.1});
  ReduceLROnPlateau sched(*g.opt, min_rel_options());
  {
    // A fresh one: best is +inf, which must survive the archive.
    Groups h({0.1});
    ReduceLROnPlateau fresh(*h.opt, ReduceLROnPlateauOptions{.mode = "max"});
    restore(fresh, saved(sched));
    CHECK(fresh.best() == std::numeric_limits<double>::infinity());
    CHECK(fresh.options().mode == "min");
  }
  const std::size_t half = 8;
  for (std::size_t i = 0; i < half; ++i) sched.step(min_rel.metrics[i]);
  const std::string opt_bytes = saved(*g.opt), sched_bytes = saved(sched);

  Groups g2({1.0});
  ReduceLROnPlateau sched2(*g2.opt, ReduceLROnPlateauOptions{.mode = "max", .patience = 100});
  restore(*g2.opt, opt_bytes);  // Adadelta's load restores the learning rate the scheduler lowered
  restore(sched2, sched_bytes);
  CHECK(sched2.options().patience == 2);
  CHECK(sched2.options().cooldown == 1);
  CHECK(sched2.min_lrs() == std::vector<double>{0.02});
  for (std::size_t i = half; i < min_rel.metrics.size(); ++i) {
    sched2.step(min_rel.metrics[i]);
    check_plateau_step(sched2, g2, min_rel, i);
  }
}

// --------------------------------------------------------------------------------------------------
// (e) Python's state_dict() layout

TEST_CASE("python_state: StepLR, MultiStepLR and ExponentialLR write Python's state_dict() for the same history") {
  {
    Groups g({1.0, 0.3});
    StepLR sched(*g.opt, 2, 0.5);
    for (int i = 0; i < 6; ++i) sched.step();
    c10::impl::GenericDict d = new_dict();
    sched.python_state(d);
    // optim_reference.py: "StepLR after 6 calls state_dict"
    check_python_layout(
        d, {"_get_lr_called_within_step", "_is_initial", "_last_lr", "_step_count", "base_lrs", "gamma", "last_epoch", "step_size"});
    CHECK(entry(d, "step_size").toInt() == 2);
    CHECK(entry(d, "gamma").toDouble() == 0.5);
    CHECK(doubles(entry(d, "base_lrs")) == std::vector<double>{1.0, 0.3});
    CHECK(entry(d, "last_epoch").toInt() == 6);
    CHECK(entry(d, "_step_count").toInt() == 7);
    CHECK(doubles(entry(d, "_last_lr")) == std::vector<double>{0.125, 0.0375});
    CHECK(entry(d, "_get_lr_called_within_step").toBool() == false);
  }
  {
    Groups g({1.0});
    MultiStepLR sched(*g.opt, {2, 5, 5}, 0.1);
    for (int i = 0; i < 7; ++i) sched.step();
    c10::impl::GenericDict d = new_dict();
    sched.python_state(d);
    // optim_reference.py: "MultiStepLR after 7 calls state_dict" (milestones = Counter({5: 2, 2: 1}))
    check_python_layout(
        d, {"_get_lr_called_within_step", "_is_initial", "_last_lr", "_step_count", "base_lrs", "gamma", "last_epoch", "milestones"});
    const auto milestones = entry(d, "milestones").toGenericDict();
    CHECK(milestones.size() == 2);
    CHECK(milestones.at(2).toInt() == 1);
    CHECK(milestones.at(5).toInt() == 2);
    CHECK(entry(d, "gamma").toDouble() == 0.1);
    CHECK(doubles(entry(d, "base_lrs")) == std::vector<double>{1.0});
    CHECK(entry(d, "last_epoch").toInt() == 7);
    CHECK(entry(d, "_step_count").toInt() == 8);
    CHECK(doubles(entry(d, "_last_lr")) == std::vector<double>{0.0010000000000000002});
  }
  {
    Groups g({0.1});
    ExponentialLR sched(*g.opt, 0.9);
    for (int i = 0; i < 6; ++i) sched.step();
    c10::impl::GenericDict d = new_dict();
    sched.python_state(d);
    // optim_reference.py: "ExponentialLR after 6 calls state_dict"
    check_python_layout(d, {"_get_lr_called_within_step", "_is_initial", "_last_lr", "_step_count", "base_lrs", "gamma", "last_epoch"});
    CHECK(entry(d, "gamma").toDouble() == 0.9);
    CHECK(doubles(entry(d, "base_lrs")) == std::vector<double>{0.1});
    CHECK(entry(d, "last_epoch").toInt() == 6);
    CHECK(entry(d, "_step_count").toInt() == 7);
    CHECK(doubles(entry(d, "_last_lr")) == std::vector<double>{0.05314410000000002});
  }
}

TEST_CASE("python_state: ReduceLROnPlateau writes Python's state_dict() for the same history") {
  const std::vector<std::string> python_keys = {"_last_lr",   "best",           "cooldown",   "cooldown_counter", "default_min_lr",
                                                "eps",        "factor",         "last_epoch", "min_lrs",          "mode",
                                                "mode_worse", "num_bad_epochs", "patience",   "threshold",        "threshold_mode"};
  {
    Groups g({0.1});
    ReduceLROnPlateau sched(*g.opt, min_rel_options());
    for (const double m : min_rel.metrics) sched.step(m);
    c10::impl::GenericDict d = new_dict();
    sched.python_state(d);
    // optim_reference.py: "ReduceLROnPlateau min/rel after 17 steps state_dict"
    check_python_layout(d, python_keys);
    CHECK(entry(d, "factor").toDouble() == 0.5);
    CHECK(doubles(entry(d, "min_lrs")) == std::vector<double>{0.02});
    CHECK(entry(d, "default_min_lr").toDouble() == 0.02);
    CHECK(entry(d, "patience").toInt() == 2);
    CHECK(entry(d, "cooldown").toInt() == 1);
    CHECK(entry(d, "cooldown_counter").toInt() == 1);
    CHECK(entry(d, "mode").toStringRef() == "min");
    CHECK(entry(d, "threshold").toDouble() == 0.1);
    CHECK(entry(d, "threshold_mode").toStringRef() == "rel");
    CHECK(entry(d, "best").toDouble() == 0.5);
    CHECK(entry(d, "num_bad_epochs").toInt() == 0);
    CHECK(entry(d, "mode_worse").toDouble() == std::numeric_limits<double>::infinity());
    CHECK(entry(d, "eps").toDouble() == 1e-08);
    CHECK(entry(d, "last_epoch").toInt() == 17);
    CHECK(doubles(entry(d, "_last_lr")) == std::vector<double>{0.02});
  }
  {
    Groups g({0.1, 0.5});
    ReduceLROnPlateau sched(*g.opt, max_abs_options());
    for (const double m : max_abs.metrics) sched.step(m);
    c10::impl::GenericDict d = new_dict();
    sched.python_state(d);
    // optim_reference.py: "ReduceLROnPlateau max/abs after 12 steps state_dict"
    check_python_layout(d, python_keys);
    CHECK(doubles(entry(d, "min_lrs")) == std::vector<double>{0.001, 0.05});
    CHECK(entry(d, "default_min_lr").isNone());
    CHECK(entry(d, "best").toDouble() == 0.7);
    CHECK(entry(d, "num_bad_epochs").toInt() == 1);
    CHECK(entry(d, "cooldown_counter").toInt() == 0);
    CHECK(entry(d, "mode_worse").toDouble() == -std::numeric_limits<double>::infinity());
    CHECK(entry(d, "last_epoch").toInt() == 12);
    CHECK(doubles(entry(d, "_last_lr")) == std::vector<double>{0.010000000000000002, 0.05});
  }
}

// --------------------------------------------------------------------------------------------------
// (f) invalid arguments

TEST_CASE("invalid arguments: a ConfigError naming the class, the argument and the value") {
  Groups g({0.1, 0.2});
  auto& opt = *g.opt;
  using dettrial::ConfigError;
  CHECK_THROWS_WITH_AS(StepLR(opt, 0), doctest::Contains("StepLR: step_size must be at least 1, not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(StepLR(opt, 2, 0.0), doctest::Contains("StepLR: gamma must be positive, not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(StepLR(opt, 2, -0.5), doctest::Contains("StepLR: gamma must be positive, not -0.5"), ConfigError);
  CHECK_THROWS_WITH_AS(MultiStepLR(opt, {3, -1}), doctest::Contains("MultiStepLR: milestones must be at least 0, not -1"), ConfigError);
  CHECK_THROWS_WITH_AS(MultiStepLR(opt, {3}, 0.0), doctest::Contains("MultiStepLR: gamma must be positive, not 0"), ConfigError);
  CHECK_THROWS_WITH_AS(ExponentialLR(opt, -1.0), doctest::Contains("ExponentialLR: gamma must be positive, not -1"), ConfigError);
  const auto plateau = [&](ReduceLROnPlateauOptions o) { ReduceLROnPlateau s(opt, std::move(o)); };
  CHECK_THROWS_WITH_AS(plateau({.factor = 1.0}), doctest::Contains("ReduceLROnPlateau: factor must be in [0, 1), not 1"), ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.mode = "avg"}), doctest::Contains("ReduceLROnPlateau: mode must be \"min\" or \"max\", not \"avg\""),
                       ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.threshold_mode = "pct"}),
                       doctest::Contains("ReduceLROnPlateau: threshold_mode must be \"rel\" or \"abs\", not \"pct\""), ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.patience = -1}), doctest::Contains("ReduceLROnPlateau: patience must be at least 0, not -1"), ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.threshold = -0.1}), doctest::Contains("ReduceLROnPlateau: threshold must be at least 0, not -0.1"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.cooldown = -2}), doctest::Contains("ReduceLROnPlateau: cooldown must be at least 0, not -2"), ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.min_lr = std::vector<double>{0.1}}),
                       doctest::Contains("ReduceLROnPlateau: min_lr must be one value per parameter group (2), not 1 values"), ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.min_lr = -0.01}), doctest::Contains("ReduceLROnPlateau: min_lr must be at least 0, not -0.01"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(plateau({.eps = -1e-8}), doctest::Contains("ReduceLROnPlateau: eps must be at least 0, not -1e-08"), ConfigError);

  Problem p;
  const auto adadelta = [&](AdadeltaOptions o) { Adadelta a(p.model->parameters(), o); };
  CHECK_THROWS_WITH_AS(adadelta(AdadeltaOptions(-1.0)), doctest::Contains("Adadelta: lr must be at least 0, not -1"), ConfigError);
  CHECK_THROWS_WITH_AS(adadelta(AdadeltaOptions().rho(1.5)), doctest::Contains("Adadelta: rho must be in [0, 1], not 1.5"), ConfigError);
  CHECK_THROWS_WITH_AS(adadelta(AdadeltaOptions().eps(-1e-6)), doctest::Contains("Adadelta: eps must be at least 0, not -1e-06"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(adadelta(AdadeltaOptions().weight_decay(-0.1)),
                       doctest::Contains("Adadelta: weight_decay must be at least 0, not -0.1"), ConfigError);
}

// ------------------------------------------------------------------------------------------------
// NAdam, RAdam and Adamax against torch.optim's (tests/python/adam_family_reference.py).

namespace {

struct AdamFamilyReference {
  const char* config;
  /// FNV-1a of both parameters and every state tensor after each of the 30 steps.
  std::uint64_t steps;
  std::vector<std::string> group_keys;
  std::vector<std::string> state_keys;
};

// Printed by tests/python/adam_family_reference.py with torch 2.15.0 (CPU).
const std::vector<AdamFamilyReference>& adam_family_references() {
  // clang-format off: as the script prints it
  static const std::vector<AdamFamilyReference> references = {
    {"NAdam()", 0x7a058d30b0fd3e83ULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "momentum_decay", "weight_decay"}, {"exp_avg", "exp_avg_sq", "mu_product", "step"}},
    {"NAdam(lr=0.01, weight_decay=0.1, momentum_decay=0.01)", 0xa47bfe0b7988414aULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "momentum_decay", "weight_decay"}, {"exp_avg", "exp_avg_sq", "mu_product", "step"}},
    {"NAdam(weight_decay=0.05, decoupled_weight_decay=True, maximize=True)", 0xf625487f330d5170ULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "momentum_decay", "weight_decay"}, {"exp_avg", "exp_avg_sq", "mu_product", "step"}},
    {"RAdam()", 0x3bbd498151d6d91cULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "weight_decay"}, {"exp_avg", "exp_avg_sq", "step"}},
    {"RAdam(lr=0.01, weight_decay=0.1)", 0x265502786daa3debULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "weight_decay"}, {"exp_avg", "exp_avg_sq", "step"}},
    {"RAdam(betas=(0.8, 0.99), weight_decay=0.05, decoupled_weight_decay=True)", 0x190201adcca5c574ULL, {"betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize", "weight_decay"}, {"exp_avg", "exp_avg_sq", "step"}},
    {"Adamax()", 0xbb330192cc22c3abULL, {"betas", "capturable", "differentiable", "eps", "foreach", "lr", "maximize", "weight_decay"}, {"exp_avg", "exp_inf", "step"}},
    {"Adamax(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, maximize=True)", 0x3ac78b5398bedf35ULL, {"betas", "capturable", "differentiable", "eps", "foreach", "lr", "maximize", "weight_decay"}, {"exp_avg", "exp_inf", "step"}},
  };
  // clang-format on
  return references;
}

/// Python's hashes printed on this machine by tests/python/adam_family_reference.py, run with the
/// Python CTest names (DETTRIAL_TEST_PYTHON: the torch of this LibTorch's release), by configuration;
/// empty where none is named. The steps' scalars (`beta2 ** step` and the like) come from the C
/// library's pow, which rounds differently in the last bit across C libraries: the same machine's
/// torch.optim is the comparison that holds anywhere (an H200 machine's Ubuntu differed from the
/// Debian one that printed the pasted values in four of eight configurations).
std::map<std::string, std::uint64_t> python_adam_family_hashes() {
  const char* python = std::getenv("DETTRIAL_TEST_PYTHON");
  if (!python || !*python) return {};
  const std::string command = "'" + std::string(python) + "' '" + test::tests_source_dir() + "/python/adam_family_reference.py'";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, command);
  std::map<std::string, std::uint64_t> hashes;
  char buffer[1024];
  while (std::fgets(buffer, sizeof buffer, pipe))
    if (const auto reference = muon_problem::reference_hash_line(buffer)) hashes.insert(*reference);
  const int status = ::pclose(pipe);
  REQUIRE_MESSAGE(status == 0, command);
  return hashes;
}

torch::Tensor reference_values(std::int64_t n, double scale, double shift) {
  return torch::arange(n, torch::kFloat32).mul(scale).add(shift);
}

std::unique_ptr<torch::optim::Optimizer> adam_family_named(const std::string& config, std::vector<torch::Tensor> params) {
  using namespace dettrial::optim;
  if (config == "NAdam()") return std::make_unique<NAdam>(params);
  if (config == "NAdam(lr=0.01, weight_decay=0.1, momentum_decay=0.01)")
    return std::make_unique<NAdam>(params, NAdamOptions(0.01).weight_decay(0.1).momentum_decay(0.01));
  if (config == "NAdam(weight_decay=0.05, decoupled_weight_decay=True, maximize=True)")
    return std::make_unique<NAdam>(params, NAdamOptions().weight_decay(0.05).decoupled_weight_decay(true).maximize(true));
  if (config == "RAdam()") return std::make_unique<RAdam>(params);
  if (config == "RAdam(lr=0.01, weight_decay=0.1)") return std::make_unique<RAdam>(params, RAdamOptions(0.01).weight_decay(0.1));
  if (config == "RAdam(betas=(0.8, 0.99), weight_decay=0.05, decoupled_weight_decay=True)")
    return std::make_unique<RAdam>(params, RAdamOptions().betas({0.8, 0.99}).weight_decay(0.05).decoupled_weight_decay(true));
  if (config == "Adamax()") return std::make_unique<Adamax>(params);
  if (config == "Adamax(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, maximize=True)")
    return std::make_unique<Adamax>(params, AdamaxOptions(0.01).betas({0.8, 0.99}).weight_decay(0.1).maximize(true));
  throw std::logic_error("no optimizer " + config);
}

/// Steps `from`, ..., 30 of adam_family_reference.py's problem, hashing as it hashes.
void adam_family_steps(torch::optim::Optimizer& opt, std::vector<torch::Tensor>& params, int from, int to, std::uint64_t& h) {
  for (int k = from; k <= to; ++k) {
    for (auto& p : params) p.mutable_grad() = reference_values(p.numel(), 0.7, 1.1 * k).remainder(3.0).sub(1.5).div(4.0).reshape(p.sizes());
    opt.step();
    for (auto& p : params) {
      const auto add = [&](const torch::Tensor& t) { muon_problem::fnv1a(h, t); };
      add(p);
      const auto& s = static_cast<const dettrial::optim::AdamFamilyParamState&>(
          *opt.state().at(dettrial::detail::optimizer_state_key<std::remove_cvref_t<decltype(opt.state())>>(p)));
      add(s.exp_avg());
      add(s.second());
      if (s.mu_product().defined()) add(s.mu_product());
    }
  }
}

std::vector<torch::Tensor> adam_family_params() {
  return {reference_values(12, 0.3, 0.0).remainder(2.0).sub(1.0).reshape({3, 4}).requires_grad_(),
          reference_values(5, 0.3, 0.0).remainder(2.0).sub(1.0).requires_grad_()};
}

}  // namespace

TEST_CASE("NAdam, RAdam and Adamax step as torch.optim's do, bit for bit, and continue from their state in Python's layout") {
#if TORCH_VERSION_MAJOR >= 2
  const std::map<std::string, std::uint64_t> python_here = python_adam_family_hashes();
  if (python_here.empty()) MESSAGE("no DETTRIAL_TEST_PYTHON: compared with the hashes torch 2.15 printed on Debian 12");
#endif
  for (const AdamFamilyReference& r : adam_family_references()) {
    INFO(std::string(r.config));
    std::vector<torch::Tensor> params = adam_family_params();
    auto opt = adam_family_named(r.config, params);
    std::uint64_t h = 0xcbf29ce484222325ULL;
    adam_family_steps(*opt, params, 1, 30, h);
#if TORCH_VERSION_MAJOR >= 2
    if (python_here.empty()) {
      CHECK(h == r.steps);  // one value one ulp off, at any step, changes it
    } else {
      REQUIRE_MESSAGE(python_here.contains(r.config), "the Python reference printed no hash for this configuration");
      CHECK(h == python_here.at(r.config));
    }
#else
    // LibTorch 1.x's kernels round some of these steps differently in the last bit than torch 2.15,
    // which printed the hashes: there the run is compared with itself (the resume below) only.
    MESSAGE("LibTorch 1.x: " << r.config << " not compared with torch 2.15's hash (other kernels), only with its own resume");
#endif

    // Python's layout: the same keys as Python's state_dict(), and the run continues from it.
    const auto [group_keys, state_keys] = muon_problem::python_layout_keys(*opt);
    CHECK(group_keys == std::set<std::string>(r.group_keys.begin(), r.group_keys.end()));
    CHECK(state_keys == std::set<std::string>(r.state_keys.begin(), r.state_keys.end()));

    std::vector<torch::Tensor> first_params = adam_family_params(), second_params = adam_family_params();
    auto first = adam_family_named(r.config, first_params);
    std::uint64_t straight = 0xcbf29ce484222325ULL;
    adam_family_steps(*first, first_params, 1, 12, straight);
    const auto saved = dettrial::optimizer_state_dict(*first);
    auto second = adam_family_named(r.config, second_params);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < second_params.size(); ++i) second_params[i].copy_(first_params[i]);
    }
    dettrial::load_optimizer_state_dict(*second, saved, "the saved state");
    std::uint64_t a = straight, b = straight;
    adam_family_steps(*first, first_params, 13, 30, a);
    adam_family_steps(*second, second_params, 13, 30, b);
    CHECK(a == b);
    CHECK(a == h);
  }
}

TEST_CASE("NAdam, RAdam and Adamax refuse a bad option naming it, and another optimizer's group options") {
  using namespace dettrial::optim;
  auto p = torch::zeros({2}, torch::requires_grad());
  CHECK_THROWS_WITH_AS(NAdam(std::vector<torch::Tensor>{p}, NAdamOptions(-1.0)), doctest::Contains("NAdam: lr must be at least 0, not -1"),
                       dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(RAdam(std::vector<torch::Tensor>{p}, RAdamOptions().betas({1.0, 0.9})),
                       doctest::Contains("RAdam: betas[0] must be in [0, 1), not 1"), dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(NAdam(std::vector<torch::Tensor>{p}, NAdamOptions().momentum_decay(-0.1)),
                       doctest::Contains("NAdam: momentum_decay must be at least 0, not -0.1"), dettrial::ConfigError);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p}, std::make_unique<torch::optim::AdamOptions>(0.1));
  CHECK_THROWS_WITH_AS(Adamax{groups}, doctest::Contains("Adamax: parameter group 0 has another optimizer's options"),
                       dettrial::ConfigError);
}

// ------------------------------------------------------------------------------------------------
// Muon against torch.optim.Muon (tests/python/muon_reference.py).

namespace {

// Printed by tests/python/muon_reference.py with torch 2.15.0 (CPU).
const std::vector<AdamFamilyReference>& muon_references() {
  // clang-format off: as the script prints it
  static const std::vector<AdamFamilyReference> references = {
    {"Muon()", 0x74917fb9240b37dcULL, {"adjust_lr_fn", "eps", "lr", "momentum", "nesterov", "ns_coefficients", "ns_steps", "weight_decay"}, {"momentum_buffer"}},
    {"Muon(lr=0.02, weight_decay=0.01, nesterov=False, adjust_lr_fn='match_rms_adamw')", 0x590e7569c88588c5ULL, {"adjust_lr_fn", "eps", "lr", "momentum", "nesterov", "ns_coefficients", "ns_steps", "weight_decay"}, {"momentum_buffer"}},
    {"Muon(momentum=0.9, eps=1e-05, ns_steps=3, adjust_lr_fn='spectral_unclamped')", 0x67c62f1281d376e6ULL, {"adjust_lr_fn", "eps", "lr", "momentum", "nesterov", "ns_coefficients", "ns_steps", "weight_decay"}, {"momentum_buffer"}},
    {"Muon(lr=0.05, ns_coefficients=(2.0, -1.5, 0.5), adjust_lr_fn='original')", 0x2b157cdc294344f6ULL, {"adjust_lr_fn", "eps", "lr", "momentum", "nesterov", "ns_coefficients", "ns_steps", "weight_decay"}, {"momentum_buffer"}},
  };
  // clang-format on
  return references;
}

}  // namespace

TEST_CASE("Muon steps as torch.optim.Muon does, bit for bit, wide and tall matrices, and continues from its state in Python's layout") {
  using muon_problem::muon_named;
  using muon_problem::muon_params;
  using muon_problem::muon_steps;
  for (const AdamFamilyReference& r : muon_references()) {
    INFO(r.config);
    std::vector<torch::Tensor> params = muon_params();
    auto opt = muon_named(r.config, params);
    std::uint64_t h = 0xcbf29ce484222325ULL;
    muon_steps(*opt, params, 1, 30, h);
#if TORCH_VERSION_MAJOR >= 2
    CHECK(h == r.steps);  // one bfloat16 value one ulp off, at any step, changes it
#else
    MESSAGE("LibTorch 1.x: " << r.config << " not compared with torch 2.15's hash (other bfloat16 kernels), only with its own resume");
#endif
    const auto [group_keys, state_keys] = muon_problem::python_layout_keys(*opt);
    CHECK(group_keys == std::set<std::string>(r.group_keys.begin(), r.group_keys.end()));
    CHECK(state_keys == std::set<std::string>(r.state_keys.begin(), r.state_keys.end()));

    // Resumed from Python's layout and from LibTorch's archive (dettrial's native checkpoints).
    std::vector<torch::Tensor> first_params = muon_params(), second_params = muon_params(), third_params = muon_params();
    auto first = muon_named(r.config, first_params);
    std::uint64_t straight = 0xcbf29ce484222325ULL;
    muon_steps(*first, first_params, 1, 12, straight);
    const auto saved = dettrial::optimizer_state_dict(*first);
    std::stringstream archive;
    torch::save(*first, archive);
    auto second = muon_named(r.config, second_params), third = muon_named(r.config, third_params);
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < second_params.size(); ++i)
        second_params[i].copy_(first_params[i]), third_params[i].copy_(first_params[i]);
    }
    dettrial::load_optimizer_state_dict(*second, saved, "the saved state");
    torch::load(*third, archive);
    std::uint64_t a = straight, b = straight, c = straight;
    muon_steps(*first, first_params, 13, 30, a);
    muon_steps(*second, second_params, 13, 30, b);
    muon_steps(*third, third_params, 13, 30, c);
    CHECK(a == h);
    CHECK(b == h);
    CHECK(c == h);
  }
}

TEST_CASE("Muon refuses a parameter that is not a matrix and a bad option, naming them") {
  using dettrial::optim::Muon;
  using dettrial::optim::MuonOptions;
  auto w = torch::zeros({2, 3}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  CHECK_THROWS_WITH_AS(Muon(std::vector<torch::Tensor>{w, b}),
                       doctest::Contains("Muon: parameter group 0's parameter 1 has 1 dimension(s); Muon steps matrices only"),
                       dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(Muon(std::vector<torch::Tensor>{w}, MuonOptions().momentum(-0.5)),
                       doctest::Contains("Muon: momentum must be at least 0, not -0.5"), dettrial::ConfigError);
  CHECK_THROWS_WITH_AS(Muon(std::vector<torch::Tensor>{w}, MuonOptions().ns_steps(100)),
                       doctest::Contains("Muon: ns_steps must be in [0, 100), not 100"), dettrial::ConfigError);
  // Another optimizer's state is refused by the reader, naming the option Muon lacks.
  torch::optim::Adam adam(std::vector<torch::Tensor>{w});
  w.mutable_grad() = torch::ones({2, 3});
  adam.step();
  Muon muon(std::vector<torch::Tensor>{w});
  CHECK_THROWS_WITH_AS(dettrial::load_optimizer_state_dict(muon, dettrial::optimizer_state_dict(adam), "adam.pt"),
                       doctest::Contains("has option 'betas', which Muon does not have"), dettrial::CheckpointError);
}

// ------------------------------------------------------------------------------------------------
// Activation checkpointing (dettrial::nn::checkpoint).

namespace {

/// A deep network with dropout, so that the recomputation must draw the same masks.
torch::nn::Sequential deep_network() {
  torch::manual_seed(3);
  torch::nn::Sequential net;
  for (int i = 0; i < 6; ++i) {
    net->push_back(torch::nn::Linear(16, 16));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Dropout(0.3));
  }
  net->push_back(torch::nn::Linear(16, 1));
  return net;
}

/// Every parameter's gradient after one forward and backward of `forward` on a fixed batch, with the
/// generator seeded alike.
std::vector<torch::Tensor> gradients_of(torch::nn::Sequential& net, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                        std::optional<at::ScalarType> autocast = std::nullopt) {
  net->zero_grad();
  const torch::Tensor x = torch::arange(64 * 16, torch::kFloat32).reshape({64, 16}).remainder(7.0).sub(3.0).div(5.0);
  torch::manual_seed(11);
  torch::Tensor loss;
  {
    std::optional<dettrial::AutocastGuard> guard;
    if (autocast) guard.emplace(torch::kCPU, autocast);
    loss = forward(x).to(torch::kFloat32).pow(2).mean();
  }
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return grads;
}

bool same_gradients(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!a[i].defined() || !b[i].defined() || !torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("activation checkpointing: gradients bit-identical to the plain run, dropout and autocast included, data inputs too") {
  torch::nn::Sequential net = deep_network();
  net->train();
  const auto plain = gradients_of(net, [&](const torch::Tensor& x) { return net->forward(x); });
  // Every block but the last recomputed (Python's checkpoint_sequential), 1 and 7 segments.
  for (const std::int64_t segments : {1, 3, 7}) {
    INFO(segments << " segments");
    CHECK(same_gradients(plain,
                         gradients_of(net, [&](const torch::Tensor& x) { return dettrial::nn::checkpoint_sequential(net, segments, x); })));
  }
  // Each block recomputed: the first block's input is data (no gradient), its parameters still get theirs.
  dettrial::nn::CheckpointEach each(net);
  CHECK(same_gradients(plain, gradients_of(net, [&](const torch::Tensor& x) { return each->forward(x); })));
  // A function of its inputs alone (Python's reentrant form), with an input that takes a gradient.
  const auto function_grads = [&](bool checkpointed) {
    torch::Tensor w = torch::linspace(-1, 1, 16).requires_grad_();
    const auto f = [](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{torch::dropout(in[0].tanh() * in[0], 0.5, /*train=*/true)};
    };
    torch::manual_seed(5);
    const torch::Tensor y = checkpointed ? dettrial::nn::checkpoint(f, {w}).front() : f({w}).front();
    y.sum().backward();
    return w.grad().clone();
  };
  CHECK(torch::equal(function_grads(false), function_grads(true)));
  // Under autocast (bf16 on the CPU) the recomputation runs under it too.
  const auto plain_bf16 = gradients_of(net, [&](const torch::Tensor& x) { return net->forward(x); }, at::kBFloat16);
  CHECK(same_gradients(plain_bf16, gradients_of(net, [&](const torch::Tensor& x) { return each->forward(x); }, at::kBFloat16)));
  CHECK(!same_gradients(plain, plain_bf16));  // it did change the arithmetic
  // In evaluation, or without grad mode, a plain call; a bad segment count is refused by name.
  torch::NoGradGuard no_grad;
  CHECK(!dettrial::nn::checkpoint_sequential(net, 3, torch::ones({2, 16})).requires_grad());
  CHECK_THROWS_WITH_AS(dettrial::nn::checkpoint_sequential(net, 0, torch::ones({2, 16})),
                       doctest::Contains("checkpoint_sequential: segments must be in [1, 19], not 0"), dettrial::ConfigError);
}
