// EXPECT: dettrial::optim::python_layout<Optimizer> must have options_type, state_type, name, options\(\), write_options
#include <dettrial/dettrial.hpp>
// A layout declared beside an optimizer that forgets how to read its state back.
struct HalfLayoutOptimizer : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};
template <>
struct dettrial::optim::python_layout<HalfLayoutOptimizer> {
  using options_type = torch::optim::SGDOptions;
  using state_type = torch::optim::SGDParamState;
  static constexpr std::string_view name = "SGD";
  static std::set<std::string> options() { return {"lr"}; }
  static void write_options(const options_type&, dettrial::StateDict&) {}
  static void read_option(options_type&, const std::string&, const c10::IValue&, const std::string&) {}
  static void write_state(const state_type&, dettrial::StateDict&) {}
};
int main() { return dettrial::optim::register_python_layout<HalfLayoutOptimizer>() ? 0 : 1; }
