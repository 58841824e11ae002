// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Hugging Face's safetensors files, read and written: how models reach people (a
/// `model.safetensors` beside its `config.json`), in a format LibTorch does not read. The format:
/// an 8-byte little-endian header length N, N bytes of a JSON header (each tensor's dtype, shape
/// and byte range in the data; an optional `__metadata__` of text to text), then the data, the
/// tensors back to back with no gap. A file is checked whole before a tensor is made: a damaged or
/// hostile one is a CheckpointError naming the file and the problem, never a crash or a huge
/// allocation (what a tensor claims must be in the file).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <map>
#include <string>

#include <torch/torch.h>

#include "../detail/linkage.hpp"
#include "../vocabulary/checkpoint.hpp"

namespace dettrial {

/// What a safetensors file holds.
struct SafetensorsContents {
  /// The tensors by name, on the CPU, in the file's order (by their place in the data).
  StateDict tensors = empty_state_dict();
  /// Its `__metadata__` (transformers writes `{"format": "pt"}`); empty when it has none.
  std::map<std::string, std::string> metadata;
};

/// The largest header dettrial reads, as Hugging Face's own reader limits it (100 MB).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

/**
 * @brief Reads a safetensors file (`safetensors.torch.save_file`, transformers' `save_pretrained`):
 * every dtype of the format that this LibTorch has a type for (BOOL, U8, I8, I16, I32, I64, F16,
 * BF16, F32, F64, C64; U16, U32, U64 and the 8-bit floats where the release has them; not the 4-
 * and 6-bit floats, which no LibTorch type holds). Each
 * tensor's bytes are read straight into it, the file is never held whole in memory. Throws
 * CheckpointError naming the file when it is not one: a header over 100 MB or past the end, not
 * JSON, an unknown dtype, a shape whose size disagrees with its byte range, ranges that overlap,
 * leave a gap or run past the end, bytes after the last tensor, a BOOL byte other than 0 or 1.
 */
DETTRIAL_INLINE SafetensorsContents read_safetensors(const std::filesystem::path& path);

/**
 * @brief Writes `tensors` (a dict of names to tensors, such as `module_state_dict(model)`) as a
 * safetensors file that `safetensors.torch.load_file` reads: laid out as Hugging Face's writer
 * lays them out (larger elements first, then by name; the header padded to 8 bytes), each tensor
 * copied to the CPU and made contiguous, written through a temporary file renamed into place.
 * `metadata` becomes `__metadata__` (give `{{"format", "pt"}}` for transformers' from_pretrained).
 * Throws CheckpointError for an entry that is not a dense tensor or whose dtype the format lacks.
 */
DETTRIAL_INLINE void write_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                                       const std::map<std::string, std::string>& metadata = {});

/// Whether the file at `path` begins as a safetensors file does (a header length within the
/// file, then `{`): how `load_weights` tells it from a `torch.save` archive.
DETTRIAL_INLINE bool looks_like_safetensors(const std::filesystem::path& path);

}  // namespace dettrial

namespace dettrial::detail {
/// The reader over a stream of `size` bytes (the file's, or a fuzz input's), `what` naming it in
/// messages ("'model.safetensors'").
DETTRIAL_INLINE SafetensorsContents read_safetensors_stream(std::istream& in, std::uint64_t size, const std::string& what);
}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/atomic_file.hpp"
#include "../detail/json.hpp"
#include "../error.hpp"
#include "state_dict.hpp"

namespace dettrial::detail {

static_assert(std::endian::native == std::endian::little,
              "dettrial's safetensors reader and writer copy the data as it is in memory: the format is little-endian");

/// One dtype of the format: its name in the header, its bytes per element, its rank in Hugging
/// Face's writer order (the format's list, from BOOL up), and LibTorch's type where this release has one.
struct SafetensorsDtype {
  std::string_view name;
  std::size_t bytes;
  int rank;
  std::optional<c10::ScalarType> type;
  std::string_view missing;  // why there is no type, when there is none
};

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DETTRIAL_SAFETENSORS_UNSIGNED(t) c10::ScalarType::t, ""
#else
#define DETTRIAL_SAFETENSORS_UNSIGNED(t) std::nullopt, "needs LibTorch 2.3 or later"
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define DETTRIAL_SAFETENSORS_FLOAT8(t) c10::ScalarType::t, ""
#else
#define DETTRIAL_SAFETENSORS_FLOAT8(t) std::nullopt, "needs LibTorch 2.1 or later"
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define DETTRIAL_SAFETENSORS_FNUZ(t) c10::ScalarType::t, ""
#else
#define DETTRIAL_SAFETENSORS_FNUZ(t) std::nullopt, "needs LibTorch 2.2 or later"
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
#define DETTRIAL_SAFETENSORS_E8M0 c10::ScalarType::Float8_e8m0fnu, ""
#else
#define DETTRIAL_SAFETENSORS_E8M0 std::nullopt, "needs LibTorch 2.7 or later"
#endif

/// The format's dtypes (safetensors 0.8), in its order.
inline const std::array<SafetensorsDtype, 22>& safetensors_dtypes() {
  static const std::array<SafetensorsDtype, 22> all = {{
      {"BOOL", 1, 0, c10::ScalarType::Bool, ""},
      {"F4", 0, 1, std::nullopt, "is 4 bits an element, which no LibTorch tensor type holds"},
      {"F6_E2M3", 0, 2, std::nullopt, "is 6 bits an element, which no LibTorch tensor type holds"},
      {"F6_E3M2", 0, 3, std::nullopt, "is 6 bits an element, which no LibTorch tensor type holds"},
      {"U8", 1, 4, c10::ScalarType::Byte, ""},
      {"I8", 1, 5, c10::ScalarType::Char, ""},
      {"F8_E5M2", 1, 6, DETTRIAL_SAFETENSORS_FLOAT8(Float8_e5m2)},
      {"F8_E4M3", 1, 7, DETTRIAL_SAFETENSORS_FLOAT8(Float8_e4m3fn)},
      {"F8_E8M0", 1, 8, DETTRIAL_SAFETENSORS_E8M0},
      {"F8_E4M3FNUZ", 1, 9, DETTRIAL_SAFETENSORS_FNUZ(Float8_e4m3fnuz)},
      {"F8_E5M2FNUZ", 1, 10, DETTRIAL_SAFETENSORS_FNUZ(Float8_e5m2fnuz)},
      {"I16", 2, 11, c10::ScalarType::Short, ""},
      {"U16", 2, 12, DETTRIAL_SAFETENSORS_UNSIGNED(UInt16)},
      {"F16", 2, 13, c10::ScalarType::Half, ""},
      {"BF16", 2, 14, c10::ScalarType::BFloat16, ""},
      {"I32", 4, 15, c10::ScalarType::Int, ""},
      {"U32", 4, 16, DETTRIAL_SAFETENSORS_UNSIGNED(UInt32)},
      {"F32", 4, 17, c10::ScalarType::Float, ""},
      {"C64", 8, 18, c10::ScalarType::ComplexFloat, ""},
      {"F64", 8, 19, c10::ScalarType::Double, ""},
      {"I64", 8, 20, c10::ScalarType::Long, ""},
      {"U64", 8, 21, DETTRIAL_SAFETENSORS_UNSIGNED(UInt64)},
  }};
  return all;
}
#undef DETTRIAL_SAFETENSORS_UNSIGNED
#undef DETTRIAL_SAFETENSORS_FLOAT8
#undef DETTRIAL_SAFETENSORS_E8M0
#undef DETTRIAL_SAFETENSORS_FNUZ

/// One tensor as the header declares it, checked against the format.
struct SafetensorsEntry {
  std::string name;
  const SafetensorsDtype* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// One header entry (`{"dtype": ..., "shape": [...], "data_offsets": [b, e]}`), its size checked
/// against its range; fields the format does not name are ignored, as Hugging Face's reader does.
DETTRIAL_INLINE SafetensorsEntry safetensors_entry(const std::string& name, const Json& info, const std::string& what) {
  const auto refuse = [&](const std::string& why) { return CheckpointError(what + ": tensor '" + name + "' " + why); };
  if (!info.is_object()) throw refuse("is " + json_kind(info) + " in the header, not an object of dtype, shape and data_offsets");
  SafetensorsEntry e;
  e.name = name;
  try {
    const std::string dtype = json_as<std::string>(json_field(info, "dtype"), "dtype");
    const auto& all = safetensors_dtypes();
    const auto it = std::find_if(all.begin(), all.end(), [&](const SafetensorsDtype& d) { return d.name == dtype; });
    if (it == all.end()) throw refuse("has dtype '" + dtype + "', which is not a safetensors dtype");
    if (!it->type) throw refuse("has dtype " + dtype + ", which " + std::string(it->missing));
    e.dtype = &*it;
    const Json& shape = json_field(info, "shape");
    if (!shape.is_array()) throw JsonFieldError("'shape' is " + json_kind(shape) + ", not a list of sizes");
    // Each size a non-negative int64, and their product (zeros counted as ones, so that a tensor of
    // no elements cannot hide an overflow from LibTorch's strides) within int64.
    std::uint64_t product = 1;
    for (const Json& size : shape) {
      const auto s = json_as<std::int64_t>(size, "shape");
      if (s < 0) throw refuse("has a negative size in its shape " + shape.dump());
      if (s > 1 && product > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / static_cast<std::uint64_t>(s))
        throw refuse("has a shape " + shape.dump() + " whose sizes multiply past 2^63");
      product *= static_cast<std::uint64_t>(std::max<std::int64_t>(s, 1));
      e.shape.push_back(s);
    }
    const Json& offsets = json_field(info, "data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) throw JsonFieldError("'data_offsets' is " + offsets.dump() + ", not [begin, end]");
    e.begin = json_as<std::uint64_t>(offsets[0], "data_offsets");
    e.end = json_as<std::uint64_t>(offsets[1], "data_offsets");
  } catch (const JsonFieldError& bad) {
    throw refuse(std::string("in the header: ") + bad.what());
  }
  if (e.end < e.begin) throw refuse("ends (byte " + std::to_string(e.end) + ") before it begins (byte " + std::to_string(e.begin) + ")");
  std::uint64_t elements = 1;
  for (const std::int64_t s : e.shape) elements *= static_cast<std::uint64_t>(s);  // within 2^63: checked above
  const std::uint64_t span = e.end - e.begin;
  if (elements > span / e.dtype->bytes || elements * e.dtype->bytes != span)
    throw refuse("is " + std::string(e.dtype->name) + " " + shape_text(c10::IntArrayRef(e.shape)) + " (" + std::to_string(elements) +
                 " elements of " + std::to_string(e.dtype->bytes) + " bytes) but its data_offsets [" + std::to_string(e.begin) + ", " +
                 std::to_string(e.end) + "] span " + std::to_string(span) + " bytes");
  return e;
}

/// The header's `__metadata__`: text to text.
DETTRIAL_INLINE std::map<std::string, std::string> safetensors_metadata(const Json& metadata, const std::string& what) {
  if (!metadata.is_object()) throw CheckpointError(what + ": its __metadata__ is " + json_kind(metadata) + ", not a map of text to text");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string())
      throw CheckpointError(what + ": its __metadata__ '" + key + "' is " + json_kind(value) + ", not text (the format keeps text only)");
    out[key] = value.get<std::string>();
  }
  return out;
}

/// The header's tensors in data order, checked to cover the data exactly: no overlap, no gap,
/// nothing after the last.
DETTRIAL_INLINE std::vector<SafetensorsEntry> safetensors_layout(const Json& header, std::uint64_t data_bytes, const std::string& what) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, info] : header.items())
    if (name != "__metadata__") entries.push_back(safetensors_entry(name, info, what));
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); });
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    const std::string before = i ? "the tensor before it, '" + entries[i - 1].name + "', ends at byte " : "the data begins at byte ";
    if (e.begin < at)
      throw CheckpointError(what + ": tensor '" + e.name + "' begins at byte " + std::to_string(e.begin) + " of the data, but " + before +
                            std::to_string(at) + ": their data_offsets overlap");
    if (e.begin > at)
      throw CheckpointError(what + ": tensor '" + e.name + "' begins at byte " + std::to_string(e.begin) + " of the data, but " + before +
                            std::to_string(at) + ": " + std::to_string(e.begin - at) + " bytes no tensor covers");
    if (e.end > data_bytes)
      throw CheckpointError(what + ": tensor '" + e.name + "' ends at byte " + std::to_string(e.end) + " of the data, past its end (" +
                            std::to_string(data_bytes) + " bytes after the header): the file is cut short");
    at = e.end;
  }
  if (at != data_bytes)
    throw CheckpointError(what + ": " + std::to_string(data_bytes - at) + " bytes follow the last tensor (the data is " +
                          std::to_string(data_bytes) + " bytes, the tensors cover " + std::to_string(at) + ")");
  return entries;
}

DETTRIAL_INLINE SafetensorsContents read_safetensors_stream(std::istream& in, std::uint64_t size, const std::string& what) {
  if (size < 8)
    throw CheckpointError(what + " is " + std::to_string(size) +
                          " bytes, too short for a safetensors file (an 8-byte header length first)");
  std::array<unsigned char, 8> length{};
  if (!in.read(reinterpret_cast<char*>(length.data()), 8)) throw CheckpointError("cannot read " + what);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[static_cast<std::size_t>(i)];
  if (n > safetensors_max_header_bytes)
    throw CheckpointError(what + " declares a header of " + std::to_string(n) + " bytes, over the format's limit of " +
                          std::to_string(safetensors_max_header_bytes) + " (not a safetensors file, or damaged)");
  if (n > size - 8)
    throw CheckpointError(what + " declares a header of " + std::to_string(n) + " bytes, but only " + std::to_string(size - 8) +
                          " follow its length (not a safetensors file, or cut short)");
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) throw CheckpointError("cannot read " + what + "'s header");
  if (text.empty() || text[0] != '{') throw CheckpointError(what + "'s header does not begin with '{' (not a safetensors file)");
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {
    throw CheckpointError(what + "'s header is not valid JSON: " + json_parse_reason(e));
  }
  if (!header.is_object()) throw CheckpointError(what + "'s header is " + json_kind(header) + ", not an object of tensors");
  SafetensorsContents out;
  if (const Json* metadata = json_find(header, "__metadata__"); metadata && !metadata->is_null())
    out.metadata = safetensors_metadata(*metadata, what);
  // Every range is checked before a tensor is made, so no allocation exceeds what the file holds.
  for (const SafetensorsEntry& e : safetensors_layout(header, size - 8 - n, what)) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(*e.dtype->type));
    auto* bytes = static_cast<char*>(t.data_ptr());
    if (!in.read(bytes, static_cast<std::streamsize>(e.end - e.begin)))
      throw CheckpointError("cannot read tensor '" + e.name + "' of " + what + " (the file ends early)");
    if (e.dtype->name == "BOOL")
      for (std::uint64_t i = 0; i < e.end - e.begin; ++i)
        if (static_cast<unsigned char>(bytes[i]) > 1)
          throw CheckpointError(what + ": tensor '" + e.name + "' is BOOL, but its element " + std::to_string(i) + " is byte " +
                                std::to_string(static_cast<unsigned char>(bytes[i])) + ", neither 0 nor 1");
    out.tensors.insert(e.name, std::move(t));
  }
  return out;
}

}  // namespace dettrial::detail

namespace dettrial {

DETTRIAL_INLINE SafetensorsContents read_safetensors(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) throw CheckpointError("cannot read '" + path.string() + "'" + (ec ? ": " + ec.message() : ""));
  return detail::read_safetensors_stream(in, size, "'" + path.string() + "'");
}

DETTRIAL_INLINE bool looks_like_safetensors(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, 9> head{};
  if (ec || size < 9 || !in.read(reinterpret_cast<char*>(head.data()), 9)) return false;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[static_cast<std::size_t>(i)];
  return n <= safetensors_max_header_bytes && n <= size - 8 && head[8] == '{';
}

DETTRIAL_INLINE void write_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  const std::string what = "cannot write '" + path.string() + "' as safetensors: ";
  struct Out {
    std::string name;
    const detail::SafetensorsDtype* dtype;
    torch::Tensor tensor;
  };
  std::vector<Out> out;
  for (const auto& entry : tensors) {
    if (!entry.key().isString()) throw CheckpointError(what + "an entry's name is not text");
    const std::string& name = entry.key().toStringRef();
    if (name == "__metadata__") throw CheckpointError(what + "'__metadata__' is the format's name for the metadata, not a tensor's");
    if (!entry.value().isTensor()) throw CheckpointError(what + "'" + name + "' is a " + entry.value().tagKind() + ", not a tensor");
    const torch::Tensor& t = entry.value().toTensor();
    if (t.layout() != torch::kStrided || t.is_quantized())
      throw CheckpointError(what + "'" + name + "' is not a dense tensor (safetensors holds dense ones only)");
    const auto& all = detail::safetensors_dtypes();
    const auto it = std::find_if(all.begin(), all.end(), [&](const auto& d) { return d.type == t.scalar_type(); });
    if (it == all.end())
      throw CheckpointError(what + "'" + name + "' is " + std::string(c10::toString(t.scalar_type())) +
                            ", which the format has no dtype for");
    out.push_back({name, &*it, t.detach().to(torch::kCPU).contiguous()});
  }
  std::sort(out.begin(), out.end(),
            [](const Out& a, const Out& b) { return a.dtype->rank != b.dtype->rank ? a.dtype->rank > b.dtype->rank : a.name < b.name; });
  detail::Json header = detail::Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const Out& o : out) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(o.tensor.numel()) * o.dtype->bytes;
    header[o.name] = {{"dtype", std::string(o.dtype->name)}, {"shape", o.tensor.sizes().vec()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump(-1, ' ', false, detail::Json::error_handler_t::strict);
  text.append((8 - text.size() % 8) % 8, ' ');  // the data aligned to 8 bytes, as Hugging Face's writer aligns it
  detail::write_atomically(path, [&](std::ostream& file) {
    std::array<char, 8> length{};
    for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    file.write(length.data(), 8);
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Out& o : out)
      file.write(static_cast<const char*>(o.tensor.data_ptr()), static_cast<std::streamsize>(o.tensor.numel() * o.tensor.element_size()));
  });
}

}  // namespace dettrial
#endif  // DETTRIAL_HEADER_DEFINITIONS
