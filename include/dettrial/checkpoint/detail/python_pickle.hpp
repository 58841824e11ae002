// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Reading what Python pickled: `torch.save` archives and plain pickles (Determined's
/// `trial_state.pkl`), into LibTorch values, without Python.
///
/// Why not LibTorch's own unpickler: it reads what TorchScript writes, and Python's checkpoints hold
/// more. Determined's `state_dict.pth` keeps NumPy's generator state (an ndarray, pickled through
/// `numpy._core.multiarray._reconstruct`, its bytes through `_codecs.encode` at protocol 2), and
/// state dicts are `OrderedDict`s with a `_metadata` attribute. This reader runs the pickle machine
/// itself over the globals such files use, and refuses any other global by name: nothing is
/// executed, as Python's weights-only loader does not execute.
///
/// What becomes what: dicts (and OrderedDicts) become dicts with keys of any type, lists and sets
/// lists, tuples tuples, `bytes` strings, tensors tensors (on the CPU, sharing storage as saved),
/// NumPy arrays tensors (unsigned integers widened to int64), NumPy scalars numbers.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// The storage record `data/<key>` of a torch.save archive, as a 1-D tensor of `numel` elements of `dtype`.
using PickleStorageLoader = std::function<torch::Tensor(const std::string& key, c10::ScalarType dtype, std::int64_t numel)>;

/// What the reader does with an object of a type it does not read (a global other than the ones
/// state dicts use): it never constructs one, and never runs anything.
enum class UnreadObjects {
  /// The whole read fails, naming the type.
  refuse,
  /// The object is kept as an opaque marker (python_object_type names it), so that a caller reading
  /// a checkpoint can refuse only the part that holds it, naming that part, or start it fresh.
  mark,
};

/// Runs a pickle (protocols 0 to 5, the opcodes Python's pickler writes) and returns its value;
/// `storages` resolves a torch.save archive's tensor storages (none for a plain pickle). Throws
/// std::runtime_error naming the opcode or global it cannot read.
DETTRIAL_INLINE c10::IValue unpickle(std::string_view pickle, const PickleStorageLoader& storages = {},
                                     UnreadObjects unread = UnreadObjects::refuse);

/// The Python type ("module.name") of the first object `value` holds that unpickle(..., mark) kept
/// unread, searching dicts, lists and tuples; nullopt when it holds none.
DETTRIAL_INLINE std::optional<std::string> python_object_type(const c10::IValue& value);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstring>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace dettrial::detail::pickle {

/// Objects the machine builds that are not values of their own (a global, a NumPy dtype, an array
/// before its BUILD) are dicts tagged with this key, so that tuples and lists can hold them.
inline constexpr const char* object_tag = "__dettrial_pickle_object__";

inline c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }

inline c10::IValue object(const std::string& kind, std::initializer_list<std::pair<const char*, c10::IValue>> fields = {}) {
  auto d = new_dict();
  d.insert(object_tag, kind);
  for (const auto& [k, v] : fields) d.insert(k, v);
  return d;
}

/// The kind of an object built by object(), or "" for an ordinary value.
inline std::string kind_of(const c10::IValue& v) {
  if (!v.isGenericDict()) return "";
  const auto d = v.toGenericDict();
  const auto it = d.find(object_tag);
  return it == d.end() ? "" : it->value().toStringRef();
}

inline c10::IValue field(const c10::IValue& object, const char* key) { return object.toGenericDict().at(key); }

/// The kind of the marker that unpickle(..., UnreadObjects::mark) keeps for an object it does not read.
inline constexpr const char* unread_kind = "unread Python object";

inline std::string unread_message(const std::string& type) {
  return "the pickle holds a Python object of type '" + type +
         "', which dettrial does not read (it reads state dicts: tensors, numbers, strings, lists, tuples, dicts, NumPy arrays)";
}

inline std::vector<c10::IValue> elements(const c10::IValue& v, const char* what) {
  if (v.isTuple()) return v.toTupleRef().elements().vec();
  if (v.isList()) return v.toList().vec();
  throw std::runtime_error(std::string(what) + " is not a tuple");
}

inline std::vector<std::int64_t> int_elements(const c10::IValue& v, const char* what) {
  std::vector<std::int64_t> out;
  for (const auto& e : elements(v, what)) {
    if (!e.isInt()) throw std::runtime_error(std::string(what) + " holds a non-integer");
    out.push_back(e.toInt());
  }
  return out;
}

DETTRIAL_INLINE c10::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> types = {{"torch.FloatStorage", c10::kFloat},
                                                               {"torch.DoubleStorage", c10::kDouble},
                                                               {"torch.HalfStorage", c10::kHalf},
                                                               {"torch.BFloat16Storage", c10::kBFloat16},
                                                               {"torch.LongStorage", c10::kLong},
                                                               {"torch.IntStorage", c10::kInt},
                                                               {"torch.ShortStorage", c10::kShort},
                                                               {"torch.CharStorage", c10::kChar},
                                                               {"torch.ByteStorage", c10::kByte},
                                                               {"torch.BoolStorage", c10::kBool},
                                                               {"torch.ComplexFloatStorage", c10::kComplexFloat},
                                                               {"torch.ComplexDoubleStorage", c10::kComplexDouble},
                                                               {"torch.UntypedStorage", c10::kByte}};
  const auto it = types.find(name);
  if (it == types.end()) throw std::runtime_error("tensor storage type '" + name + "' is not one dettrial reads");
  return it->second;
}

/// A NumPy dtype string ("u4", "<f8", "|b1") as a tensor type and item size; unsigned types wider
/// than a byte are read into int64.
DETTRIAL_INLINE std::pair<c10::ScalarType, std::size_t> numpy_dtype(const c10::IValue& dtype) {
  if (kind_of(dtype) != "numpy.dtype") throw std::runtime_error("a NumPy array's dtype is not a dtype");
  const std::string descr = field(dtype, "descr").toStringRef();
  const std::string order = field(dtype, "order").toStringRef();
  if (order == ">") throw std::runtime_error("a big-endian NumPy array ('" + descr + "') is not one dettrial reads");
  static const std::map<std::string, std::pair<c10::ScalarType, std::size_t>> types = {
      {"b1", {c10::kBool, 1}}, {"u1", {c10::kByte, 1}}, {"i1", {c10::kChar, 1}},  {"i2", {c10::kShort, 2}},
      {"u2", {c10::kLong, 2}}, {"i4", {c10::kInt, 4}},  {"u4", {c10::kLong, 4}},  {"i8", {c10::kLong, 8}},
      {"u8", {c10::kLong, 8}}, {"f2", {c10::kHalf, 2}}, {"f4", {c10::kFloat, 4}}, {"f8", {c10::kDouble, 8}}};
  const auto it = types.find(descr);
  if (it == types.end()) throw std::runtime_error("NumPy dtype '" + descr + "' is not one dettrial reads");
  return it->second;
}

/// NumPy's array state `(version, shape, dtype, is_fortran, raw bytes)` as a tensor.
DETTRIAL_INLINE torch::Tensor numpy_array(const c10::IValue& state) {
  const auto s = elements(state, "a NumPy array's state");
  if (s.size() != 5) throw std::runtime_error("a NumPy array's state has " + std::to_string(s.size()) + " entries, not 5");
  const std::vector<std::int64_t> shape = int_elements(s[1], "a NumPy array's shape");
  const auto [dtype, item] = numpy_dtype(s[2]);
  if (!s[4].isString()) throw std::runtime_error("a NumPy array of Python objects is not one dettrial reads");
  const std::string& raw = s[4].toStringRef();
  std::int64_t count = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || (d > 0 && count > static_cast<std::int64_t>(raw.size()) / d))
      throw std::runtime_error("a NumPy array's shape does not fit its " + std::to_string(raw.size()) + " bytes");
    count *= d;
  }
  if (raw.size() != static_cast<std::size_t>(count) * item)
    throw std::runtime_error("a NumPy array holds " + std::to_string(raw.size()) + " bytes for " + std::to_string(count) + " items");
  const std::string descr = field(s[2], "descr").toStringRef();
  torch::Tensor out = torch::empty({count}, dtype);
  if (descr == "u2" || descr == "u4") {  // widened: no unsigned tensor types in every LibTorch
    auto* to = out.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < count; ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, raw.data() + i * item, item);
      to[i] = static_cast<std::int64_t>(v);
    }
  } else {
    std::memcpy(out.data_ptr(), raw.data(), raw.size());
  }
  return s[3].toBool() ? out.reshape(std::vector<std::int64_t>(shape.rbegin(), shape.rend())).t().contiguous() : out.reshape(shape);
}

/// `numpy.core.multiarray.scalar(dtype, bytes)`: a NumPy number as a Python one.
DETTRIAL_INLINE c10::IValue numpy_scalar(const std::vector<c10::IValue>& args) {
  if (args.size() != 2 || !args[1].isString()) throw std::runtime_error("a NumPy scalar is not (dtype, bytes)");
  const auto [dtype, item] = numpy_dtype(args[0]);
  if (args[1].toStringRef().size() != item) throw std::runtime_error("a NumPy scalar's bytes do not fit its dtype");
  const std::string descr = field(args[0], "descr").toStringRef();
  if (descr == "u2" || descr == "u4") {
    std::uint32_t v = 0;
    std::memcpy(&v, args[1].toStringRef().data(), item);
    return static_cast<std::int64_t>(v);
  }
  torch::Tensor t = torch::empty({1}, dtype);
  std::memcpy(t.data_ptr(), args[1].toStringRef().data(), item);
  if (t.is_floating_point()) return t.item<double>();
  if (dtype == c10::kBool) return t.item<bool>();
  return t.item<std::int64_t>();
}

/// `_codecs.encode(text, encoding)`, how protocol 2 pickles `bytes`: the text's code points are the bytes.
DETTRIAL_INLINE std::string encode_bytes(const std::string& utf8, const std::string& encoding) {
  if (encoding != "latin1" && encoding != "latin-1") return utf8;
  std::string out;
  for (std::size_t i = 0; i < utf8.size(); ++i) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xe0) == 0xc0 && i + 1 < utf8.size()) {
      out.push_back(static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3f)));
    } else {
      throw std::runtime_error("_codecs.encode: a code point above 255 in latin1 text");
    }
  }
  return out;
}

/// The containers (lists, dicts, tuples) a value reaches, each once, without recursion: with the
/// memo, a pickle can share one container many times (a value of 2^n paths in n opcodes) or make
/// one hold itself. `visit(container)` sees each once, parents before children; `on_cycle` is told
/// when a container is reached again while it is still being walked. Returns the longest chain of
/// containers (1: a container of leaves; 0: no container), however they are shared.
template <class Visit, class OnCycle>
std::size_t walk_containers(const std::vector<const c10::IValue*>& roots, Visit visit, OnCycle on_cycle) {
  struct Frame {
    c10::IValue value;
    std::vector<c10::IValue> children;
    std::size_t next = 0;
    std::size_t height = 1;
  };
  // A container's height once walked; 0 while it is on the walk's path.
  std::unordered_map<const void*, std::size_t> heights;
  std::vector<Frame> path;
  const auto children_of = [](const c10::IValue& v) {
    std::vector<c10::IValue> out;
    if (v.isList()) {
      const auto l = v.toList();
      for (std::size_t i = 0; i < l.size(); ++i) out.push_back(l.get(i));
    } else if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) {
        out.push_back(e.key());
        out.push_back(e.value());
      }
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) out.push_back(e);
    }
    return out;
  };
  const auto is_container = [](const c10::IValue& v) { return v.isList() || v.isGenericDict() || v.isTuple(); };
  std::size_t tallest = 0;
  // Enters `v`, or returns the height it already has (0 on the path: a cycle).
  const auto enter = [&](const c10::IValue& v) -> std::optional<std::size_t> {
    const auto [it, fresh] = heights.try_emplace(v.internalToPointer(), 0);
    if (!fresh) {
      if (it->second == 0) on_cycle();
      return it->second;
    }
    visit(v);
    path.push_back({v, children_of(v), 0, 1});
    return std::nullopt;
  };
  for (const c10::IValue* root : roots) {
    if (!is_container(*root) || enter(*root)) continue;
    while (!path.empty()) {
      Frame& top = path.back();
      if (top.next == top.children.size()) {
        const std::size_t height = top.height;
        heights[top.value.internalToPointer()] = height;
        tallest = std::max(tallest, height);
        path.pop_back();
        if (!path.empty()) path.back().height = std::max(path.back().height, height + 1);
        continue;
      }
      const c10::IValue child = top.children[top.next++];
      if (!is_container(child)) continue;
      if (const auto known = enter(child)) top.height = std::max(top.height, *known + 1);
    }
  }
  return tallest;
}

/// How deep a pickle's containers may nest: state dicts nest a handful of levels; a deeper value
/// would be freed, and read, by recursion as deep.
inline constexpr std::size_t max_nesting = 100;

/// The pickle machine: its stack, marks and memo, and the opcodes' effects.
class Machine {
 public:
  Machine(std::string_view pickle, const PickleStorageLoader& storages, UnreadObjects unread)
      : in_(pickle), storages_(storages), unread_(unread) {}
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;
  /// A pickle refused halfway may have left containers holding themselves (through the memo):
  /// every container it built is emptied, so none outlives the machine in a cycle.
  ~Machine() {
    if (!checked_) break_apart();
  }

  c10::IValue run();

 private:
  [[noreturn]] void fail(const std::string& why) const { throw std::runtime_error("pickle offset " + std::to_string(at_) + ": " + why); }
  std::string_view take(std::uint64_t n) {
    if (n > in_.size() - at_) fail("the pickle ends inside an opcode");  // (at_ + n could wrap)
    const std::string_view out = in_.substr(at_, n);
    at_ += n;
    return out;
  }
  std::uint64_t little(std::size_t n) {
    const std::string_view b = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    return v;
  }
  std::string line() {
    const std::size_t nl = in_.find('\n', at_);
    if (nl == std::string_view::npos) fail("the pickle ends inside a text argument");
    std::string out(in_.substr(at_, nl - at_));
    at_ = nl + 1;
    return out;
  }
  c10::IValue pop() {
    if (stack_.size() <= floor()) fail("the stack is empty");
    c10::IValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<c10::IValue> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    std::vector<c10::IValue> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back())),
                                   std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  c10::IValue& top() {
    if (stack_.size() <= floor()) fail("the stack is empty");
    return stack_.back();
  }
  // Every container the machine makes goes through made(), and every insertion through set_items
  // and append_items, so that nesting is bounded as it is built (a tuple of a tuple ... a million
  // deep is a million bytes, and would be freed by a recursion as deep), and so that a refused
  // pickle can break every cycle: one can only form by an insertion into an existing container.
  c10::IValue tuple(std::vector<c10::IValue> items) {
    const std::size_t height = height_over(items);
    return made(c10::ivalue::Tuple::create(std::move(items)), height);
  }
  c10::IValue list(std::vector<c10::IValue> items) {
    const std::size_t height = height_over(items);
    c10::impl::GenericList l(c10::AnyType::get());
    for (auto& i : items) l.push_back(std::move(i));
    return made(std::move(l), height);
  }
  c10::IValue dict() { return made(new_dict(), 1); }
  /// The height of a container over `items`: one more than the tallest of them.
  std::size_t height_over(const std::vector<c10::IValue>& items) const {
    std::size_t tallest = 0;
    for (const c10::IValue& i : items) tallest = std::max(tallest, height_of(i));
    return tallest + 1;
  }
  std::size_t height_of(const c10::IValue& v) const {
    if (!v.isList() && !v.isGenericDict() && !v.isTuple()) return 0;
    const auto it = heights_.find(v.internalToPointer());
    return it == heights_.end() ? 1 : it->second;  // a marker of the machine's own: a dict of texts
  }
  void check_height(std::size_t height) const {
    if (height > max_nesting)
      fail("lists, dicts and tuples nested " + std::to_string(height) + " deep, more than the " + std::to_string(max_nesting) +
           " dettrial reads");
  }
  /// Registers a container the machine made (kept alive by it, so that its address is not reused).
  c10::IValue made(c10::IValue container, std::size_t height) {
    check_height(height);
    heights_[container.internalToPointer()] = height;
    created_.push_back(container);
    return container;
  }
  /// `target` receives items of height up to `items_height`: kept, to be broken apart on a refusal.
  void inserting_into(const c10::IValue& target, std::size_t items_height) {
    const std::size_t height = std::max(height_of(target), items_height + 1);
    check_height(height);
    heights_[target.internalToPointer()] = height;
    if (mutated_set_.insert(target.internalToPointer()).second) mutated_.push_back(target);
  }
  void put(std::uint64_t slot) { memo_[slot] = top(); }
  void get(std::uint64_t slot) {
    const auto it = memo_.find(slot);
    if (it == memo_.end()) fail("memo slot " + std::to_string(slot) + " is empty");
    stack_.push_back(it->second);
  }
  void set_items(std::vector<c10::IValue> items) {
    c10::IValue& target = top();
    if (kind_of(target) == unread_kind)
      fail("the pickle sets items on a Python object of type '" + field(target, "name").toStringRef() + "', which dettrial does not read");
    if (!target.isGenericDict() || !kind_of(target).empty()) fail("SETITEMS on something that is not a dict");
    inserting_into(target, height_over(items) - 1);
    auto d = target.toGenericDict();
    for (std::size_t i = 0; i + 1 < items.size(); i += 2) d.insert_or_assign(std::move(items[i]), std::move(items[i + 1]));
  }
  void append_items(std::vector<c10::IValue> items) {
    c10::IValue& target = top();
    if (!target.isList()) fail("APPENDS on something that is not a list");
    inserting_into(target, height_over(items) - 1);
    auto l = target.toList();
    for (auto& i : items) l.push_back(std::move(i));
  }
  c10::IValue long_value(std::string_view bytes) {
    if (bytes.empty()) return std::int64_t{0};
    if (bytes.size() > 8) fail("an integer wider than 64 bits");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    if (bytes.size() < 8 && (static_cast<unsigned char>(bytes.back()) & 0x80)) v |= ~std::uint64_t{0} << (8 * bytes.size());
    return static_cast<std::int64_t>(v);
  }
  c10::IValue global(const std::string& module, const std::string& name);
  c10::IValue call(const c10::IValue& callable, std::vector<c10::IValue> args);
  c10::IValue build(c10::IValue object, c10::IValue state);
  c10::IValue persistent_load(const c10::IValue& id);
  bool step(unsigned char op);

  std::string_view in_;
  std::size_t at_ = 0;
  const PickleStorageLoader& storages_;
  UnreadObjects unread_;
  std::vector<c10::IValue> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, c10::IValue> memo_;
  std::map<std::string, torch::Tensor> storage_cache_;
  std::optional<c10::IValue> result_;
  bool checked_ = false;
  std::unordered_map<const void*, std::size_t> heights_;
  std::vector<c10::IValue> created_, mutated_;
  std::unordered_set<const void*> mutated_set_;
  void break_apart() noexcept;
};

DETTRIAL_INLINE c10::IValue Machine::global(const std::string& module, const std::string& name) {
  std::string full = module + "." + name;
  // NumPy moved its internals from numpy.core to numpy._core in 2.0; pickles name either.
  if (full.rfind("numpy.core.", 0) == 0) full = "numpy._core." + full.substr(std::strlen("numpy.core."));
  if (full == "__builtin__.set" || full == "__builtin__.frozenset") full = "builtins." + name;
  return object("global", {{"name", full}});
}

DETTRIAL_INLINE c10::IValue Machine::call(const c10::IValue& callable, std::vector<c10::IValue> args) {
  if (kind_of(callable) != "global") fail("REDUCE of something that is not a global");
  const std::string name = field(callable, "name").toStringRef();
  const auto arg = [&](std::size_t i) -> const c10::IValue& {
    if (i >= args.size()) fail(name + " has too few arguments");
    return args[i];
  };
  // An argument of the type the callable takes, or a refusal naming both (never LibTorch's
  // "Expected Tensor but got ...").
  const auto typed = [&](std::size_t i, bool is, const char* type) -> const c10::IValue& {
    if (!is) fail(name + "'s argument " + std::to_string(i + 1) + " is not " + type);
    return args[i];
  };
  const auto tensor_arg = [&](std::size_t i) { return typed(i, arg(i).isTensor(), "a tensor storage").toTensor(); };
  const auto int_arg = [&](std::size_t i) { return typed(i, arg(i).isInt(), "an integer").toInt(); };
  const auto text_arg = [&](std::size_t i) -> const std::string& { return typed(i, arg(i).isString(), "a text").toStringRef(); };
  if (name == "collections.OrderedDict") {
    c10::IValue d = dict();
    if (!args.empty()) {
      std::vector<c10::IValue> items;
      for (const auto& pair : elements(arg(0), "OrderedDict's items"))
        for (auto& e : elements(pair, "an OrderedDict item")) items.push_back(std::move(e));
      stack_.push_back(d);
      set_items(std::move(items));
      stack_.pop_back();
    }
    return d;
  }
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    const torch::Tensor storage = tensor_arg(0);
    const std::vector<std::int64_t> size = int_elements(arg(2), "a tensor's size"), stride = int_elements(arg(3), "a tensor's stride");
    return storage.as_strided(size, stride, int_arg(1));
  }
  if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") return arg(0);
  if (name == "_codecs.encode") return encode_bytes(text_arg(0), args.size() > 1 ? text_arg(1) : "utf-8");
  if (name == "numpy._core.multiarray._reconstruct") return object("numpy.ndarray");
  if (name == "numpy.dtype") return object("numpy.dtype", {{"descr", text_arg(0)}, {"order", std::string("=")}});
  if (name == "numpy._core.multiarray.scalar") return numpy_scalar(args);
  if (name == "builtins.set" || name == "builtins.frozenset") return args.empty() ? list({}) : list(elements(arg(0), "a set's items"));
  if (name == "torch.device") return arg(0);
  if (name == "torch.Size") return tuple(elements(arg(0), "a torch.Size"));
  if (name.rfind("torch.jit._pickle.build_", 0) == 0 || name == "torch.jit._pickle.restore_type_tag") return arg(0);
  // Dict subclasses that state dicts hold, as their items: MultiStepLR's milestones are a Counter
  // (pickled as Counter(dict)); a defaultdict pickles its factory, then its items (SETITEMS).
  if (name == "collections.Counter") return args.empty() ? dict() : c10::IValue(arg(0));
  if (name == "collections.defaultdict") return dict();
  if (unread_ == UnreadObjects::mark) return object(unread_kind, {{"name", name}});
  fail(unread_message(name));
}

DETTRIAL_INLINE c10::IValue Machine::build(c10::IValue object, c10::IValue state) {
  const std::string kind = kind_of(object);
  if (kind == "numpy.ndarray") return numpy_array(state);
  if (kind == "numpy.dtype") {
    const auto s = elements(state, "a NumPy dtype's state");
    if (s.size() > 1 && s[1].isString()) object.toGenericDict().insert_or_assign("order", s[1]);
    return object;
  }
  if (kind == unread_kind) return object;                          // its state is not read either
  if (object.isGenericDict() || object.isTensor()) return object;  // an OrderedDict's `_metadata`, a tensor's hooks
  fail("BUILD of something dettrial cannot set state on");
}

DETTRIAL_INLINE c10::IValue Machine::persistent_load(const c10::IValue& id) {
  const auto parts = elements(id, "a persistent id");
  if (parts.size() < 5 || !parts[0].isString() || parts[0].toStringRef() != "storage") fail("a persistent id other than a tensor storage");
  if (!storages_) fail("a tensor storage in a plain pickle (not a torch.save archive)");
  if (!parts[2].isString() || !parts[4].isInt()) fail("a tensor storage's persistent id without its key and element count");
  const std::string key = parts[2].toStringRef();
  if (const auto it = storage_cache_.find(key); it != storage_cache_.end()) return it->second;
  if (kind_of(parts[1]) != "global") fail("a storage without its type");
  const torch::Tensor storage = storages_(key, storage_dtype(field(parts[1], "name").toStringRef()), parts[4].toInt());
  storage_cache_[key] = storage;
  return storage;
}

DETTRIAL_INLINE c10::IValue Machine::run() {
  while (!result_) {
    if (at_ >= in_.size()) fail("the pickle ends without STOP");
    const auto op = static_cast<unsigned char>(in_[at_++]);
    if (!step(op)) fail("opcode 0x" + c10::str(std::hex, static_cast<int>(op)) + " is not one dettrial reads");
  }
  // What Python's pickler writes of a state dict is a tree of shared leaves: a container that
  // holds itself, or nesting deeper than max_nesting, is a crafted file.
  // Everything the machine holds is walked, the memo and what is left on the stack too: a cycle
  // there, unreachable from the result, would outlive the machine.
  std::vector<const c10::IValue*> held = {&*result_};
  for (const c10::IValue& v : stack_) held.push_back(&v);
  for (const auto& [slot, v] : memo_) held.push_back(&v);
  bool cycle = false;
  const std::size_t deepest = walk_containers(held, [](const c10::IValue&) {}, [&] { cycle = true; });
  if (cycle) fail("a list, dict or tuple holds itself (a value Python's state dicts never are)");
  if (deepest > max_nesting)
    fail("lists, dicts and tuples nested " + std::to_string(deepest) + " deep, more than the " + std::to_string(max_nesting) +
         " dettrial reads");
  checked_ = true;
  return *result_;
}

DETTRIAL_INLINE void Machine::break_apart() noexcept {
  // Every cycle passes through a container that received an insertion: emptied, none survives. The
  // rest is a forest of bounded height, freed as usual.
  for (c10::IValue& v : mutated_) {
    if (v.isList()) v.toList().clear();
    else if (v.isGenericDict()) v.toGenericDict().clear();
  }
  stack_.clear();
  memo_.clear();
  result_.reset();
}

// One case per opcode, as the protocol's table reads.
DETTRIAL_INLINE bool Machine::step(unsigned char op) {
  switch (op) {
    case 0x80: take(1); break;  // PROTO
    case 0x95: take(8); break;  // FRAME
    case '.': result_ = pop(); break;
    case '(': marks_.push_back(stack_.size()); break;
    case '0': pop(); break;
    case '1': pop_to_mark(); break;
    case '2': stack_.push_back(top()); break;
    case 'N': stack_.emplace_back(); break;
    case 0x88: stack_.emplace_back(true); break;
    case 0x89: stack_.emplace_back(false); break;
    case 'I': {
      const std::string t = line();
      if (t == "00" || t == "01") stack_.emplace_back(t == "01");
      else stack_.emplace_back(static_cast<std::int64_t>(std::stoll(t)));
      break;
    }
    case 'L': {
      std::string t = line();
      if (!t.empty() && t.back() == 'L') t.pop_back();
      stack_.emplace_back(static_cast<std::int64_t>(std::stoll(t)));
      break;
    }
    case 'J': stack_.emplace_back(static_cast<std::int64_t>(static_cast<std::int32_t>(little(4)))); break;
    case 'K': stack_.emplace_back(static_cast<std::int64_t>(little(1))); break;
    case 'M': stack_.emplace_back(static_cast<std::int64_t>(little(2))); break;
    case 0x8a: stack_.push_back(long_value(take(little(1)))); break;
    case 0x8b: stack_.push_back(long_value(take(little(4)))); break;
    case 'F': stack_.emplace_back(std::stod(line())); break;
    case 'G': {
      const std::string_view b = take(8);
      std::uint64_t bits = 0;
      for (const char c : b) bits = bits << 8 | static_cast<unsigned char>(c);
      double v = 0;
      std::memcpy(&v, &bits, 8);
      stack_.emplace_back(v);
      break;
    }
    case 'X':
    case 'T':
    case 'B': stack_.emplace_back(std::string(take(little(4)))); break;  // BINUNICODE BINSTRING BINBYTES
    case 0x8c:
    case 'U':
    case 'C': stack_.emplace_back(std::string(take(little(1)))); break;  // SHORT_*
    case 0x8d:
    case 0x8e:
    case 0x96: stack_.emplace_back(std::string(take(little(8)))); break;  // *8, BYTEARRAY8
    case 'V': stack_.emplace_back(line()); break;                         // UNICODE (raw-unicode-escape; ASCII as is)
    case ']': stack_.push_back(list({})); break;
    case 'l': stack_.push_back(list(pop_to_mark())); break;
    case 'a': {
      c10::IValue v = pop();
      append_items({std::move(v)});
      break;
    }
    case 'e': append_items(pop_to_mark()); break;
    case ')': stack_.push_back(tuple({})); break;
    case 't': stack_.push_back(tuple(pop_to_mark())); break;
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<c10::IValue> items(op - 0x84);
      for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
      stack_.push_back(tuple(std::move(items)));
      break;
    }
    case '}': stack_.emplace_back(dict()); break;
    case 'd': {
      std::vector<c10::IValue> items = pop_to_mark();
      stack_.emplace_back(dict());
      set_items(std::move(items));
      break;
    }
    case 's': {
      c10::IValue value = pop(), key = pop();
      set_items({std::move(key), std::move(value)});
      break;
    }
    case 'u': set_items(pop_to_mark()); break;
    case 0x8f: stack_.push_back(list({})); break;             // EMPTY_SET
    case 0x90: append_items(pop_to_mark()); break;            // ADDITEMS
    case 0x91: stack_.push_back(list(pop_to_mark())); break;  // FROZENSET
    case 'c': {
      const std::string module = line();
      stack_.push_back(global(module, line()));
      break;
    }
    case 0x93: {  // STACK_GLOBAL
      const c10::IValue name = pop(), module = pop();
      if (!name.isString() || !module.isString()) fail("STACK_GLOBAL of something that is not a name");
      stack_.push_back(global(module.toStringRef(), name.toStringRef()));
      break;
    }
    case 'R': {
      const c10::IValue args = pop(), callable = pop();
      stack_.push_back(call(callable, elements(args, "REDUCE's arguments")));
      break;
    }
    case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
      const c10::IValue args = pop(), cls = pop();
      stack_.push_back(call(cls, elements(args, "NEWOBJ's arguments")));
      break;
    }
    case 'b': {
      c10::IValue state = pop();
      c10::IValue object = pop();
      c10::IValue built = build(object, std::move(state));
      if (!built.is(object))  // the memo holds the object before its BUILD: it now means the built one
        for (auto& [slot, value] : memo_)
          if (value.is(object)) value = built;
      stack_.push_back(std::move(built));
      break;
    }
    case 'p': put(std::stoull(line())); break;
    case 'q': put(little(1)); break;
    case 'r': put(little(4)); break;
    case 0x94: put(memo_.size()); break;  // MEMOIZE
    case 'g': get(std::stoull(line())); break;
    case 'h': get(little(1)); break;
    case 'j': get(little(4)); break;
    case 'Q': stack_.push_back(persistent_load(pop())); break;
    default: return false;
  }
  return true;
}

}  // namespace dettrial::detail::pickle

namespace dettrial::detail {
DETTRIAL_INLINE c10::IValue unpickle(std::string_view pickle, const PickleStorageLoader& storages, UnreadObjects unread) {
  return detail::pickle::Machine(pickle, storages, unread).run();
}

DETTRIAL_INLINE std::optional<std::string> python_object_type(const c10::IValue& value) {
  // Without recursion, each shared container once: a value can share one many times.
  std::optional<std::string> found;
  detail::pickle::walk_containers(
      {&value},
      [&](const c10::IValue& v) {
        if (!found && detail::pickle::kind_of(v) == detail::pickle::unread_kind) found = detail::pickle::field(v, "name").toStringRef();
      },
      [] {});
  return found;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
