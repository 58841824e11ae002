// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief State dicts Python can load: models as name-to-tensor maps with Python's names, optimizers
/// in Python's layout, written as a `torch.save` zip archive; and loading a model's state dict back
/// with every name and shape checked before anything is copied.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "../vocabulary/checkpoint.hpp"
#include "../error.hpp"
#include "../optim/adadelta.hpp"
#include "../optim/handles.hpp"
#include "../detail/text.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

namespace detail {

/**
 * @brief `value` as a `torch.save` archive (a zip with `data.pkl` and `data/<n>`). The pickler is
 * told not to tag containers with TorchScript types, so the file uses only the globals Python's
 * weights-only loader allows (`_rebuild_tensor_v2`, the storage types, `OrderedDict`).
 */
DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value);

/// A pickle Python's torch.save wrote, rewritten into the opcodes LibTorch's unpickler reads.
DETTRIAL_INLINE std::string pickle_for_libtorch(std::string_view pickle);

/// Reads an archive written by pickle_archive or by Python's `torch.save` (state dicts, checkpoints:
/// dicts, lists, tensors, numbers, strings); `file` names it in errors.
DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file);

/// Every parameter and buffer of a module with Python's state-dict names, in Python's order.
template <class F>
void for_each_state_entry(const torch::nn::Module& module, F&& f) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? std::string() : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      if (p.value().defined()) f(prefix + p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
      if (b.value().defined()) f(prefix + b.key(), b.value());
  }
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes);

inline c10::IValue scalar_tensor(double v) { return torch::tensor(v, torch::kFloat32); }

/// Adam and AdamW keep the same state and options under the same names.
template <class State>
void adam_param_state(const State& s, c10::impl::GenericDict& out) {
  out.insert("step", scalar_tensor(static_cast<double>(s.step())));
  for (const auto& [key, t] :
       {std::pair{"exp_avg", s.exp_avg()}, std::pair{"exp_avg_sq", s.exp_avg_sq()}, std::pair{"max_exp_avg_sq", s.max_exp_avg_sq()}})
    if (t.defined()) out.insert(key, t.detach());
}
template <class Options>
void adam_options(const Options& o, c10::impl::GenericDict& out) {
  out.insert("lr", o.lr());
  out.insert("betas", c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
  out.insert("eps", o.eps());
  out.insert("weight_decay", o.weight_decay());
  out.insert("amsgrad", o.amsgrad());
  out.insert("maximize", false);
}

/// One parameter's optimizer state and its group's options, in Python's names, for the built-in optimizers.
DETTRIAL_INLINE bool python_param_state(const torch::optim::OptimizerParamState& state, c10::impl::GenericDict& out);

DETTRIAL_INLINE void python_group_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& out);

}  // namespace detail

/**
 * @brief A module's state dict as Python's `module.state_dict()` has it: parameters and buffers under
 * their dotted names (`0.weight`, `fc1.bias`, `bn.running_mean`), detached.
 */
DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module);

/**
 * @brief An optimizer's state dict in Python's layout: `state` keyed by parameter index (counted
 * across groups), `param_groups` with their options and `params` as those indices. The built-in
 * optimizers (SGD, Adam, AdamW, Adagrad, RMSprop, and dettrial::optim::Adadelta) are written in full; for others, groups carry
 * their learning rate and the state is left empty.
 */
DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer);

/**
 * @brief Copies a state dict into a module after checking it fits: every parameter and buffer of the
 * module present with the same shape, and no entry the module lacks. On any mismatch nothing is
 * copied and CheckpointError names `what` (the file and model) and the entry.
 */
DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string_view>

namespace dettrial {
namespace detail {

DETTRIAL_INLINE std::string pickle_archive(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t n) {
    out.append(static_cast<const char*>(bytes), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return out;
}

DETTRIAL_INLINE std::string pickle_for_libtorch(std::string_view pickle) {
  // LibTorch's unpickler reads what LibTorch writes, not all that Python's torch.save writes:
  // - `collections.OrderedDict` becomes None (LibTorch expects one only as a tensor's empty backward
  //   hooks), so a Python state dict (an OrderedDict with a `_metadata` attribute) does not load;
  // - SETITEM and APPEND (one item at a time, which Python writes for a batch of one) are unknown.
  // So the pickle is rewritten opcode by opcode, following the stack: `OrderedDict()` becomes an
  // empty dict (its items follow as SETITEMS either way); BUILD, which would set `_metadata`, goes
  // with the opcodes of that state (POP is unknown too); SETITEM becomes MARK (put before its key)
  // + SETITEMS, APPEND MARK + APPENDS.
  // Pickles are position-independent (the memo is indexed, not addressed), so this is safe.
  struct Entry {
    std::size_t start;  // where the opcodes that pushed it begin in `out`
    bool mark = false;
    bool ordered_dict = false;  // the OrderedDict class itself (emitted as nothing)
  };
  std::string out;
  out.reserve(pickle.size() + 64);
  std::vector<Entry> stack;
  std::set<std::uint64_t> class_memo;           // memo slots of the OrderedDict class (left empty)
  std::map<std::uint64_t, std::size_t> put_at;  // where each memo slot was filled in `out`
  std::set<std::uint64_t> dropped_memo;         // slots filled inside dropped opcodes
  bool rewrote = false;
  std::size_t i = 0;
  const auto fail = [](const std::string& why) { throw std::runtime_error("unsupported pickle: " + why); };
  const auto need = [&](std::size_t n) {
    if (i + n > pickle.size()) fail("it ends inside an opcode");
  };
  const auto little_endian = [&](std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < n; ++b) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(pickle[at + b])) << (8 * b);
    return v;
  };
  const auto line_end = [&](std::size_t from) {
    const std::size_t nl = pickle.find('\n', from);
    if (nl == std::string_view::npos) fail("it ends inside a text argument");
    return nl + 1;
  };
  const auto pop = [&](std::size_t n) {
    if (stack.size() < n) fail("stack underflow");
    for (std::size_t k = 0; k < n; ++k) {
      if (stack.back().ordered_dict) fail("an OrderedDict is built other than as OrderedDict()");
      stack.pop_back();
    }
  };
  const auto pop_to_mark = [&] {  // pops through the mark; returns where the mark began
    while (!stack.empty() && !stack.back().mark) pop(1);
    if (stack.empty()) fail("no MARK");
    const std::size_t start = stack.back().start;
    stack.pop_back();
    return start;
  };
  const auto top_is_class = [&] { return !stack.empty() && stack.back().ordered_dict; };
  while (i < pickle.size()) {
    const std::size_t start = i;
    const unsigned char op = static_cast<unsigned char>(pickle[i++]);
    std::size_t arg_end = i;
    // clang-format off: one line per argument size, as the protocol's table reads
    switch (op) {
      case 0x80: case 'K': case 'q': case 'h': case 0x82: arg_end = i + 1; break;  // PROTO BININT1 BINPUT BINGET EXT1
      case 'M': case 0x83: arg_end = i + 2; break;                                   // BININT2 EXT2
      case 'J': case 'r': case 'j': case 0x84: arg_end = i + 4; break;               // BININT LONG_BINPUT LONG_BINGET EXT4
      case 'G': case 0x95: arg_end = i + 8; break;                                   // BINFLOAT FRAME
      case 0x8a: case 'U': case 'C': case 0x8c: need(1); arg_end = i + 1 + little_endian(i, 1); break;  // LONG1 SHORT_BIN*
      case 0x8b: case 'X': case 'T': case 'B': need(4); arg_end = i + 4 + little_endian(i, 4); break;   // LONG4 BIN*
      case 0x8d: case 0x8e: case 0x96: need(8); arg_end = i + 8 + little_endian(i, 8); break;            // *8
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': case 'p': case 'g': arg_end = line_end(i); break;
      case 'c': case 'i': arg_end = line_end(line_end(i)); break;  // GLOBAL, INST: module and name lines
      default: break;
    }
    // clang-format on
    need(arg_end - i);
    i = arg_end;
    const std::string_view whole = pickle.substr(start, arg_end - start);
    const std::size_t here = out.size();
    switch (op) {
      case 'c':
        if (whole == std::string_view("ccollections\nOrderedDict\n")) {
          stack.push_back({here, false, true});
          rewrote = true;
          continue;
        }
        stack.push_back({here});
        break;
      case 'q':
      case 'r': {  // PUT: the OrderedDict class's slot is remembered, not filled
        const std::uint64_t slot = little_endian(start + 1, op == 'q' ? 1 : 4);
        if (top_is_class()) {
          class_memo.insert(slot);
          continue;
        }
        put_at[slot] = here;
        break;
      }
      case 'p':
      case 'g': throw std::runtime_error("unsupported pickle: text PUT and GET opcodes (protocol 0)");
      case 'h':
      case 'j':
        if (dropped_memo.count(little_endian(start + 1, op == 'h' ? 1 : 4)))
          fail("a value inside a state dict's _metadata is used elsewhere");
        if (class_memo.count(little_endian(start + 1, op == 'h' ? 1 : 4))) {
          stack.push_back({here, false, true});
          continue;
        }
        stack.push_back({here});
        break;
      case ')':
        if (top_is_class() && i < pickle.size() && pickle[i] == 'R') {  // OrderedDict() → {}
          ++i;
          const std::size_t at = stack.back().start;
          stack.pop_back();
          stack.push_back({at});
          out.push_back('}');
          continue;
        }
        stack.push_back({here});
        break;
      case 's':
      case 'a': {  // SETITEM, APPEND → MARK before the key (or item) + SETITEMS, APPENDS
        const std::size_t items = op == 's' ? 2 : 1;
        if (stack.size() < items + 1) fail("stack underflow");
        const std::size_t first = stack[stack.size() - items].start;
        pop(items);
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(first), '(');
        out.push_back(op == 's' ? 'u' : 'e');
        continue;
      }
      case 'b':  // BUILD: after a rewritten OrderedDict the state is its `_metadata`: its opcodes are dropped
        if (rewrote) {
          if (stack.empty()) fail("stack underflow");
          const std::size_t state_start = stack.back().start;
          pop(1);
          out.resize(state_start);
          for (const auto& [slot, at] : put_at)
            if (at >= state_start) dropped_memo.insert(slot);
          continue;
        }
        pop(1);
        break;
      case '(': stack.push_back({here, true}); break;
      case 't':
      case 'l':
      case 'd': stack.push_back({pop_to_mark()}); break;  // TUPLE LIST DICT
      case 'u':
      case 'e': pop_to_mark(); break;  // SETITEMS APPENDS
      case '1': pop_to_mark(); break;  // POP_MARK
      case '0': pop(1); break;
      case '2':
        if (stack.empty()) fail("DUP of nothing");
        stack.push_back(stack.back());
        break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const std::size_t n = op - 0x84;
        if (stack.size() < n) fail("stack underflow");
        const std::size_t at = stack[stack.size() - n].start;
        pop(n);
        stack.push_back({at});
        break;
      }
      case 'R':
      case 0x81:
      case 0x93: {  // REDUCE NEWOBJ STACK_GLOBAL: two in, one out
        if (stack.size() < 2) fail("stack underflow");
        const std::size_t at = stack[stack.size() - 2].start;
        pop(2);
        stack.push_back({at});
        break;
      }
      case 'Q': {  // BINPERSID: replaces the top
        if (stack.empty()) fail("stack underflow");
        const std::size_t at = stack.back().start;
        pop(1);
        stack.push_back({at});
        break;
      }
      case 0x80:
      case 0x95:
      case 0x94:
      case '.': break;  // PROTO FRAME MEMOIZE STOP
      case 'K':
      case 'M':
      case 'J':
      case 'I':
      case 'L':
      case 'F':
      case 'G':
      case 'S':
      case 'T':
      case 'U':
      case 'V':
      case 'X':
      case 'B':
      case 'C':
      case 0x8a:
      case 0x8b:
      case 0x8c:
      case 0x8d:
      case 0x8e:
      case 'N':
      case 0x88:
      case 0x89:
      case '}':
      case ']':
      case 'P':
      case 0x8f: stack.push_back({here}); break;
      default: fail("opcode " + std::to_string(op));
    }
    out.append(whole);
  }
  return out;
}

DETTRIAL_INLINE c10::IValue unpickle_archive(const std::string& bytes, const std::filesystem::path& file) {
  try {
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    auto [pickle_data, pickle_size] = reader.getRecord("data.pkl");
    const std::string pickle = pickle_for_libtorch(std::string_view(static_cast<const char*>(pickle_data.get()), pickle_size));
    std::size_t read = 0;
    torch::jit::Unpickler unpickler(
        [&](char* buffer, std::size_t n) {
          n = std::min(n, pickle.size() - read);
          std::memcpy(buffer, pickle.data() + read, n);
          read += n;
          return n;
        },
        /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
        [&](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); }, /*device=*/{});
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  } catch (const std::exception& e) {
    throw CheckpointError("cannot read '" + file.string() + "' as a torch.save archive: " + first_line(e.what()));
  }
}

DETTRIAL_INLINE std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

DETTRIAL_INLINE bool python_param_state(const torch::optim::OptimizerParamState& state, c10::impl::GenericDict& out) {
  auto put = [&](const char* key, const torch::Tensor& t) {
    if (t.defined()) out.insert(key, t.detach());
  };
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    put("momentum_buffer", s->momentum_buffer());
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    adam_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    adam_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    out.insert("step", scalar_tensor(static_cast<double>(s->step())));
    put("sum", s->sum());
  } else if (const auto* s = dynamic_cast<const dettrial::optim::AdadeltaParamState*>(&state)) {
    dettrial::optim::python_param_state(*s, out);
  } else if (const auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    out.insert("step", static_cast<std::int64_t>(s->step()));
    put("square_avg", s->square_avg());
    put("momentum_buffer", s->momentum_buffer());
    put("grad_avg", s->grad_avg());
  } else {
    return false;
  }
  return true;
}

DETTRIAL_INLINE void python_group_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& out) {
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("momentum", o->momentum());
    out.insert("dampening", o->dampening());
    out.insert("weight_decay", o->weight_decay());
    out.insert("nesterov", o->nesterov());
    out.insert("maximize", false);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    adam_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    adam_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("lr_decay", o->lr_decay());
    out.insert("weight_decay", o->weight_decay());
    out.insert("initial_accumulator_value", o->initial_accumulator_value());
    out.insert("eps", o->eps());
    out.insert("maximize", false);
  } else if (const auto* o = dynamic_cast<const dettrial::optim::AdadeltaOptions*>(&options)) {
    dettrial::optim::python_group_options(*o, out);
  } else if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    out.insert("lr", o->lr());
    out.insert("alpha", o->alpha());
    out.insert("eps", o->eps());
    out.insert("weight_decay", o->weight_decay());
    out.insert("momentum", o->momentum());
    out.insert("centered", o->centered());
    out.insert("maximize", false);
  } else {
    out.insert("lr", options.get_lr());
  }
}

}  // namespace detail

DETTRIAL_INLINE StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out(c10::StringType::get(), c10::TensorType::get());
  // LibTorch's pickler writes CPU and CUDA tensors (a CUDA one is copied out and tagged with its
  // device); others, such as the lazy device's, are saved as CPU copies.
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& t) {
    out.insert(name, t.device().is_cpu() || t.device().is_cuda() ? t.detach() : t.detach().cpu());
  });
  return out;
}

DETTRIAL_INLINE StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  StateDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t index = 0;
  auto& states = optimizer.state();
  using StateMap = std::remove_cvref_t<decltype(states)>;
  for (auto& group : optimizer.param_groups()) {
    StateDict g(c10::StringType::get(), c10::AnyType::get());
    detail::python_group_options(group.options(), g);
    // A list typed Any: an int-typed one would be pickled with TorchScript's build_intlist, which
    // Python's weights-only loader refuses.
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& p : group.params()) {
      params.push_back(index);
      if (const auto it = states.find(detail::optimizer_state_key<StateMap>(p)); it != states.end()) {
        StateDict s(c10::StringType::get(), c10::AnyType::get());
        if (detail::python_param_state(*it->second, s) && s.size() > 0) state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  StateDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

DETTRIAL_INLINE void load_module_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& what) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::map<std::string, bool> used;
  for (const auto& entry : state) used[entry.key().toStringRef()] = false;
  detail::for_each_state_entry(module, [&](const std::string& name, const torch::Tensor& target) {
    const auto it = state.find(name);
    if (it == state.end())
      throw CheckpointError(what + " has no entry '" + name + "', which the model has (" + std::to_string(state.size()) +
                            " entries in the checkpoint): is it from another network?");
    if (!it->value().isTensor()) throw CheckpointError(what + ": entry '" + name + "' is not a tensor");
    const torch::Tensor source = it->value().toTensor();
    if (source.sizes() != target.sizes())
      throw CheckpointError(what + ": entry '" + name + "' has shape " + detail::shape_text(source.sizes()) + " in the checkpoint but " +
                            detail::shape_text(target.sizes()) + " in the model");
    used[name] = true;
    copies.emplace_back(target, source);
  });
  for (const auto& [name, seen] : used)
    if (!seen) throw CheckpointError(what + " has entry '" + name + "', which the model does not have: is it from another network?");
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
