// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief TensorBoard event files: scalars, histograms and hyperparameters, written as TensorBoard
/// reads them (TFRecord framing of `Event` protocol buffers) while training runs.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../error.hpp"
#include "../detail/atomic_file.hpp"
#include "../detail/linkage.hpp"

namespace dettrial::detail::tensorboard {

/// CRC-32C (Castagnoli), the checksum of TFRecord framing.
DETTRIAL_INLINE std::uint32_t crc32c(std::string_view bytes);
/// TFRecord's masked CRC-32C (rotated and offset, so that a CRC of CRCs is not trivially zero).
inline std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/**
 * @brief The protocol-buffer wire format for the few field kinds an `Event` uses.
 *
 * Not libprotobuf: that would make a header-only library link a generated message library (and
 * match its protoc version) for eight small messages whose field numbers are fixed by TensorBoard.
 */
class Message {
 public:
  /// int32, int64, enum and bool fields.
  Message& varint(int field, std::uint64_t value);
  /// A double field (fixed 64 bits).
  Message& fixed64(int field, double value);
  /// A float field (fixed 32 bits).
  Message& fixed32(int field, float value);
  /// string, bytes and embedded-message fields.
  Message& bytes(int field, std::string_view value);
  Message& message(int field, const Message& m) { return bytes(field, m.str()); }
  /// A packed repeated double field.
  Message& packed_doubles(int field, const std::vector<double>& values);
  const std::string& str() const { return out_; }

 private:
  void put_varint(std::uint64_t value);
  void put_key(int field, int wire_type) { put_varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type)); }
  std::string out_;
};

/// One TFRecord: the length (8 bytes), its masked CRC, the data, the data's masked CRC.
DETTRIAL_INLINE std::string frame(std::string_view data);

/// The complete records of an event file, in order. `torn` when it ends in a partial record or one
/// whose checksum fails (a crash mid-write): that tail is left out.
struct Records {
  std::vector<std::string> records;
  bool torn = false;
};
DETTRIAL_INLINE Records read_records(const std::filesystem::path& file);

/// An Event's `step` (0 when absent, as protocol buffers read a missing field).
DETTRIAL_INLINE std::int64_t event_step(std::string_view event);

/// The event files of a folder (`events.out.tfevents.*`), oldest name first.
DETTRIAL_INLINE std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir);

}  // namespace dettrial::detail::tensorboard

namespace dettrial {

/// A hyperparameter's value as TensorBoard's hparams plugin shows it.
using HParamValue = std::variant<double, std::string, bool>;

/**
 * @brief Writes one TensorBoard event file (`<dir>/events.out.tfevents.<time>.<host>.<pid>`), as
 * PyTorch's `SummaryWriter` does: scalars, histograms, and the run's hyperparameters for the
 * hparams dashboard.
 *
 * The trainer writes every training and validation metric into the run's `tensorboard/` folder;
 * a trial adds its own through `context.get_tensorboard_writer()`. Records are buffered and flushed
 * at every report, so a crash loses at most the scalars since the last one. A default-constructed
 * writer (every rank but the chief) writes nothing.
 */
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  /**
   * Starts a new event file in `dir`. Resuming a trial from its checkpoint at `resumed_at` batches,
   * the events the stopped run wrote after that batch describe training that is about to be done
   * again: they are removed from the folder's earlier files first, with a torn last record, so that
   * TensorBoard shows each step once.
   */
  explicit TensorBoardWriter(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at = std::nullopt);
  TensorBoardWriter(TensorBoardWriter&&) = default;
  TensorBoardWriter& operator=(TensorBoardWriter&&) = default;
  ~TensorBoardWriter() { flush(); }

  bool enabled() const { return out_.is_open(); }
  /// The folder, and this writer's event file in it (empty when disabled).
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& file() const { return file_; }
  /// How many events opening it for a resume removed from earlier files.
  std::size_t dropped() const { return dropped_; }
  /// Whether the folder's earlier files already start an hparams session (a resumed run's do).
  bool has_session() const { return has_session_; }

  /// Removes the events after batch `batch` (and any session end) from the event files in `dir`, a
  /// torn last record too; a file left with nothing but its version record is deleted. Returns how
  /// many events went. `batch` -1 empties the folder of events (a run started afresh there).
  static std::size_t drop_events_after(const std::filesystem::path& dir, std::int64_t batch);

  /// A scalar at `step` (TensorBoard stores it as a 32-bit float).
  void add_scalar(std::string_view tag, double value, std::int64_t step);
  /// A histogram of `values` (any shape, any device; non-finite values are left out) in `bins`
  /// equal-width buckets between their minimum and maximum.
  void add_histogram(std::string_view tag, const torch::Tensor& values, std::int64_t step, std::int64_t bins = 30);
  /// Text at `step` (TensorBoard's text dashboard renders it as Markdown): a language model's samples.
  void add_text(std::string_view tag, std::string_view text, std::int64_t step);
  /// The run's hyperparameters (TensorBoard's hparams dashboard: one session per run folder, its
  /// metrics the run's scalars). `group` names the session's group (a search's trial).
  void add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams, std::string_view group = {});
  /// Marks the hparams session ended, successfully or not.
  void end_session(bool success);
  /// Writes what is buffered to the file.
  void flush();

 private:
  void write_event(std::int64_t step, const detail::tensorboard::Message& summary);
  void write_hparams_data(std::string_view tag, const detail::tensorboard::Message& plugin_data);

  std::filesystem::path dir_{}, file_{};
  std::ofstream out_{};
  std::size_t dropped_ = 0;
  bool has_session_ = false;
};

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

namespace dettrial::detail::tensorboard {

/// The byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;  // reflected Castagnoli
    table[i] = crc;
  }
  return table;
}
inline constexpr std::array<std::uint32_t, 256> kCrc32cTable = crc32c_table();

/// Little-endian fixed-width integers, as both TFRecord framing and protocol buffers store them.
DETTRIAL_INLINE void put_fixed(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
}
DETTRIAL_INLINE std::uint64_t get_fixed(const char* p, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return value;
}

DETTRIAL_INLINE std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (const char c : bytes) crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

DETTRIAL_INLINE void Message::put_varint(std::uint64_t value) {
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

DETTRIAL_INLINE Message& Message::varint(int field, std::uint64_t value) {
  put_key(field, 0);
  put_varint(value);
  return *this;
}

DETTRIAL_INLINE Message& Message::fixed64(int field, double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(field, 1);
  put_fixed(out_, bits, 8);
  return *this;
}

DETTRIAL_INLINE Message& Message::fixed32(int field, float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(field, 5);
  put_fixed(out_, bits, 4);
  return *this;
}

DETTRIAL_INLINE Message& Message::bytes(int field, std::string_view value) {
  put_key(field, 2);
  put_varint(value.size());
  out_.append(value);
  return *this;
}

DETTRIAL_INLINE Message& Message::packed_doubles(int field, const std::vector<double>& values) {
  std::string packed;
  packed.reserve(values.size() * 8);
  for (const double v : values) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    put_fixed(packed, bits, 8);
  }
  return bytes(field, packed);
}

DETTRIAL_INLINE std::string frame(std::string_view data) {
  std::string length;
  put_fixed(length, data.size(), 8);
  std::string out = length;
  put_fixed(out, masked_crc32c(length), 4);
  out.append(data);
  put_fixed(out, masked_crc32c(data), 4);
  return out;
}

DETTRIAL_INLINE Records read_records(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Records out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) return out.torn = true, out;
    const std::string_view length_bytes(bytes.data() + at, 8);
    if (get_fixed(bytes.data() + at + 8, 4) != masked_crc32c(length_bytes)) return out.torn = true, out;
    const std::uint64_t length = get_fixed(bytes.data() + at, 8);
    if (bytes.size() - at - 12 < 4 || length > bytes.size() - at - 16) return out.torn = true, out;  // no overflow
    const std::string_view data(bytes.data() + at + 12, length);
    if (get_fixed(bytes.data() + at + 12 + length, 4) != masked_crc32c(data)) return out.torn = true, out;
    out.records.emplace_back(data);
    at += 12 + length + 4;
  }
  return out;
}

DETTRIAL_INLINE std::int64_t event_step(std::string_view event) {
  std::size_t at = 0;
  auto varint = [&](std::uint64_t& value) {
    value = 0;
    for (int shift = 0; at < event.size() && shift < 64; shift += 7) {
      const auto byte = static_cast<unsigned char>(event[at++]);
      value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (at < event.size()) {
    std::uint64_t key = 0, value = 0;
    if (!varint(key)) return 0;
    const int field = static_cast<int>(key >> 3);
    switch (key & 7) {
      case 0:
        if (!varint(value)) return 0;
        if (field == 2) return static_cast<std::int64_t>(value);
        break;
      case 1: at += 8; break;  // past the end: the loop ends
      case 5: at += 4; break;
      case 2:
        if (!varint(value) || value > event.size() - at) return 0;
        at += value;
        break;
      default: return 0;  // groups: never in an Event
    }
  }
  return 0;
}

DETTRIAL_INLINE std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.is_regular_file(ec) && entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace dettrial::detail::tensorboard

namespace dettrial::detail::tensorboard {
/// An Event's wall_time: seconds since the epoch.
DETTRIAL_INLINE double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace dettrial::detail::tensorboard

namespace dettrial {
DETTRIAL_INLINE std::size_t TensorBoardWriter::drop_events_after(const std::filesystem::path& dir, std::int64_t batch) {
  namespace tb = detail::tensorboard;
  std::size_t dropped = 0;
  std::error_code ec;
  for (const auto& path : tb::event_files(dir)) {
    tb::Records read = tb::read_records(path);
    // The stopped run's session end goes too: the resumed run ends the session again.
    const auto past = std::remove_if(read.records.begin(), read.records.end(), [&](const std::string& event) {
      return tb::event_step(event) > batch || event.find("_hparams_/session_end_info") != std::string::npos;
    });
    const auto removed = static_cast<std::size_t>(read.records.end() - past) + (read.torn ? 1 : 0);
    if (removed == 0) continue;
    read.records.erase(past, read.records.end());
    dropped += removed;
    if (read.records.size() <= 1) {  // nothing but the version record
      std::filesystem::remove(path, ec);
      continue;
    }
    std::string kept;
    for (const auto& event : read.records) kept += tb::frame(event);
    detail::write_atomically(path, kept);
  }
  return dropped;
}

DETTRIAL_INLINE TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir, std::optional<std::int64_t> resumed_at) : dir_(dir) {
  namespace tb = detail::tensorboard;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create TensorBoard folder '" + dir.string() + "': " + ec.message());
  if (resumed_at) dropped_ = drop_events_after(dir, *resumed_at);
  for (const auto& path : tb::event_files(dir)) {
    for (const auto& event : tb::read_records(path).records)
      if (event.find("_hparams_/session_start_info") != std::string::npos) has_session_ = true;
    if (has_session_) break;
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  // TensorBoard reads a folder's files in name order: the time first, then a counter so that two
  // writers started in one second (a quick resume) still sort by start.
  const auto seconds = static_cast<long long>(detail::tensorboard::wall_time_now());
  for (int n = 0;; ++n) {
    file_ =
        dir / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid()) + "." + std::to_string(n));
    if (!std::filesystem::exists(file_, ec)) break;
  }
  out_.open(file_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("cannot write TensorBoard event file '" + file_.string() + "'");
  tb::Message version;
  version.fixed64(1, detail::tensorboard::wall_time_now()).bytes(3, "brain.Event:2");
  out_ << tb::frame(version.str());
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::write_event(std::int64_t step, const detail::tensorboard::Message& summary) {
  if (!out_.is_open()) return;
  detail::tensorboard::Message event;
  event.fixed64(1, detail::tensorboard::wall_time_now()).varint(2, static_cast<std::uint64_t>(step)).message(5, summary);
  out_ << detail::tensorboard::frame(event.str());
}

DETTRIAL_INLINE void TensorBoardWriter::add_scalar(std::string_view tag, double value, std::int64_t step) {
  if (!out_.is_open()) return;
  detail::tensorboard::Message v, summary;
  v.bytes(1, tag).fixed32(2, static_cast<float>(value));
  summary.message(1, v);
  write_event(step, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::add_histogram(std::string_view tag, const torch::Tensor& values, std::int64_t step,
                                                      std::int64_t bins) {
  if (!out_.is_open()) return;
  if (bins < 1) throw Error("add_histogram('" + std::string(tag) + "'): bins must be at least 1, not " + std::to_string(bins));
  const torch::NoGradGuard no_grad;
  torch::Tensor x = values.detach().to(torch::kCPU, torch::kDouble).flatten();
  x = x.index({torch::isfinite(x)});
  detail::tensorboard::Message histo;
  if (x.numel() == 0) {
    histo.fixed64(1, 0).fixed64(2, 0).fixed64(3, 0).fixed64(4, 0).fixed64(5, 0);
  } else {
    const double lo = x.min().item<double>(), hi = x.max().item<double>();
    const torch::Tensor counts =
        lo == hi ? torch::full({1}, static_cast<double>(x.numel()), torch::kDouble) : torch::histc(x, bins, lo, hi);
    std::vector<double> limits, buckets;
    const std::int64_t n = counts.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      limits.push_back(i + 1 == n ? hi : lo + (hi - lo) * static_cast<double>(i + 1) / static_cast<double>(n));
      buckets.push_back(counts[i].item<double>());
    }
    histo.fixed64(1, lo)
        .fixed64(2, hi)
        .fixed64(3, static_cast<double>(x.numel()))
        .fixed64(4, x.sum().item<double>())
        .fixed64(5, (x * x).sum().item<double>())
        .packed_doubles(6, limits)
        .packed_doubles(7, buckets);
  }
  detail::tensorboard::Message v, summary;
  v.bytes(1, tag).message(5, histo);
  summary.message(1, v);
  write_event(step, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::add_text(std::string_view tag, std::string_view text, std::int64_t step) {
  if (!out_.is_open()) return;
  // A string tensor (TensorProto: dtype 7, DT_STRING; an empty shape, a scalar; string_val) with
  // the text plugin's metadata, as tensorboard.summary's text() writes it.
  detail::tensorboard::Message plugin, metadata, shape, tensor, v, summary;
  plugin.bytes(1, "text");
  metadata.message(1, plugin);
  tensor.varint(1, 7).message(2, shape).bytes(8, text);
  v.bytes(1, tag).message(8, tensor).message(9, metadata);
  summary.message(1, v);
  write_event(step, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::write_hparams_data(std::string_view tag, const detail::tensorboard::Message& plugin_data) {
  namespace tb = detail::tensorboard;
  // SummaryMetadata{plugin_data{plugin_name "hparams", content}}, and the empty float tensor the
  // plugin's own writer attaches (TensorBoard reads plugin summaries as tensors).
  tb::Message plugin, metadata, shape, null_tensor, v, summary;
  plugin.bytes(1, "hparams").bytes(2, plugin_data.str());
  metadata.message(1, plugin);
  shape.message(2, tb::Message{});             // one dimension of size 0
  null_tensor.varint(1, 1).message(2, shape);  // DT_FLOAT
  v.bytes(1, tag).message(9, metadata).message(8, null_tensor);
  summary.message(1, v);
  write_event(0, summary);
}

DETTRIAL_INLINE void TensorBoardWriter::add_hparams(const std::vector<std::pair<std::string, HParamValue>>& hparams,
                                                    std::string_view group) {
  if (!out_.is_open()) return;
  namespace tb = detail::tensorboard;
  tb::Message start;
  for (const auto& [name, value] : hparams) {
    tb::Message proto_value, entry;  // google.protobuf.Value: number 2, string 3, bool 4
    if (const auto* number = std::get_if<double>(&value)) proto_value.fixed64(2, *number);
    else if (const auto* text = std::get_if<std::string>(&value)) proto_value.bytes(3, *text);
    else proto_value.varint(4, std::get<bool>(value) ? 1 : 0);
    entry.bytes(1, name).message(2, proto_value);  // a map entry: key 1, value 2
    start.message(1, entry);
  }
  if (!group.empty()) start.bytes(4, group);
  start.fixed64(5, detail::tensorboard::wall_time_now());
  tb::Message data;  // HParamsPluginData{version 0, session_start_info 3}
  data.message(3, start);
  write_hparams_data("_hparams_/session_start_info", data);
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::end_session(bool success) {
  if (!out_.is_open()) return;
  namespace tb = detail::tensorboard;
  tb::Message end, data;
  end.varint(1, success ? 1 : 2).fixed64(2, detail::tensorboard::wall_time_now());  // STATUS_SUCCESS, STATUS_FAILURE
  data.message(4, end);
  write_hparams_data("_hparams_/session_end_info", data);
  out_.flush();
}

DETTRIAL_INLINE void TensorBoardWriter::flush() {
  if (out_.is_open()) out_.flush();
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
