// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Checkpoint directories on disk: written crash-safely (temporary directory, fsync, rename),
/// listed, checked (sizes and CRC-32 of every file), retained and deleted.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../layout.hpp"
#include "../error.hpp"
#include "../detail/json_fwd.hpp"
#include "../vocabulary/metrics.hpp"
#include "../detail/crc32.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// The layout version dettrial writes into `metadata.json`; it refuses to read newer ones.
/// - 1: LibTorch's archive (`dettrial_state.pt`) holds every optimizer and scheduler again, beside
///   Python's layout in `state_dict.pth`;
/// - 2: each tensor is stored once: optimizers and schedulers are restored from Python's layout, and
///   `dettrial_state.pt` (written only when needed) holds what that layout cannot express.
inline constexpr std::int64_t checkpoint_format_version = 2;

/// One complete checkpoint directory, as its `metadata.json` describes it.
struct CheckpointInfo {
  std::filesystem::path path{};
  std::string uuid;
  /// Determined's `steps_completed`: batches trained when it was written.
  std::int64_t batches_trained = 0;
  std::int64_t epochs_trained = 0;
  /// Write order within its storage directory (1, 2, ...).
  std::int64_t sequence = 0;
  /// Its `dettrial_format` (checkpoint_format_version when written); 0 for one Determined wrote.
  std::int64_t format = 0;
  /// The searcher metric of the validation at the same batch, if there was one.
  std::optional<double> validation_metric{};
  /// Written by Determined (its metadata has `determined_version` and no `dettrial_format`): the
  /// optimizers and schedulers are read from Python's layout, the progress from `trial_state.pkl`.
  bool by_determined = false;
};

/// How many checkpoints a trial keeps (Determined's `checkpoint_storage.save_trial_*`).
struct Retention {
  /// The best N by the searcher metric (checkpoints that have a validation).
  std::int64_t save_trial_best = 1;
  /// The N most recent.
  std::int64_t save_trial_latest = 1;
};

}  // namespace dettrial

namespace dettrial::detail {

inline std::string errno_text() { return std::strerror(errno); }

/// Writes `bytes` to `path` and fsyncs it, so a crash after this returns cannot lose or tear it.
DETTRIAL_INLINE void write_file_synced(const std::filesystem::path& path, std::string_view bytes);

/// Makes a directory's entries (new files, renames) durable.
DETTRIAL_INLINE void sync_directory(const std::filesystem::path& dir);

DETTRIAL_INLINE std::string read_file_bytes(const std::filesystem::path& path);

/// A random (version 4) UUID, Determined's name for a checkpoint directory.
DETTRIAL_INLINE std::string new_uuid();

DETTRIAL_INLINE bool is_hidden(const std::filesystem::path& p);

/// Removes what an interrupted writer or deleter left behind (hidden `.tmp-*` / `.deleting-*` folders).
DETTRIAL_INLINE void remove_stale_entries(const std::filesystem::path& storage);

/**
 * @brief Spreads a background write over a time budget. On a machine whose cores training keeps
 * busy, a writer that runs flat out takes a thick slice of a few steps (slow steps: the p99); paced,
 * it takes a thin slice of many. After each piece, the writer sleeps while it is ahead of an even
 * schedule (`expected_bytes` over `budget`); hurry() (someone waits for the write) ends the pacing
 * at once. Thread-safe: the writer calls wrote(), any thread hurry().
 */
class WritePace {
 public:
  WritePace(std::chrono::duration<double> budget, std::size_t expected_bytes)
      : start_(std::chrono::steady_clock::now()), budget_(budget), expected_(expected_bytes) {}
  /// `bytes` more are written: returns when the schedule allows the next piece, or when hurried.
  void wrote(std::size_t bytes) {
    written_ += bytes;
    if (expected_ == 0) return;
    const double share = std::min(1.0, static_cast<double>(written_) / static_cast<double>(expected_));
    const auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(budget_ * share);
    std::unique_lock lock(mutex_);
    woken_.wait_until(lock, due, [&] { return hurried_; });
  }
  /// Ends the pacing: the rest is written as fast as it can be.
  void hurry() {
    {
      std::lock_guard lock(mutex_);
      hurried_ = true;
    }
    woken_.notify_all();
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::duration<double> budget_;
  std::size_t expected_ = 0, written_ = 0;
  std::mutex mutex_;
  std::condition_variable woken_;
  bool hurried_ = false;
};

}  // namespace dettrial::detail

namespace dettrial {
/**
 * @brief Writes one checkpoint crash-safely: every file goes into a hidden temporary directory and
 * is synced; `commit` writes `metadata.json` (with each file's size and CRC-32) last, syncs, and
 * renames the directory into place. Until then the storage holds only complete checkpoints; a
 * writer destroyed without commit removes its temporary directory.
 */
class CheckpointWriter {
 public:
  /// With a `pace`, the files' bytes are written at its rate (see WritePace).
  CheckpointWriter(std::filesystem::path storage, std::string uuid, detail::WritePace* pace = nullptr);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  ~CheckpointWriter();

  void add_file(const std::string& name, std::string_view bytes);

  /// Receives a file's bytes piece by piece.
  using ByteSink = std::function<void(const void* data, std::size_t size)>;
  /// Writes file `name` from the pieces `produce` passes to the sink it is given, as they come:
  /// a large file is never held in memory whole.
  void add_file(const std::string& name, const std::function<void(const ByteSink&)>& produce);

  /// Writes `metadata.json`: the members of `fields` (a JSON object), then `"files"` (each file's
  /// `"size"` and `"crc32"`), and moves the checkpoint into place. Returns its final path.
  std::filesystem::path commit(detail::Json fields);

 private:
  std::filesystem::path storage_;
  std::string uuid_;
  std::filesystem::path temp_;
  /// Each file added: its name, size and CRC-32, in the order added.
  struct FileEntry {
    std::string name;
    std::size_t size = 0;
    std::uint32_t crc32 = 0;
  };
  std::vector<FileEntry> files_;
  detail::WritePace* pace_ = nullptr;
  bool committed_ = false;
};

/**
 * @brief Reads and checks a checkpoint directory's `metadata.json`: present, parsable, a format this
 * dettrial reads, and (when `verify_files`) every listed file present with its size and CRC-32.
 * Throws CheckpointError naming the file at fault.
 */
DETTRIAL_INLINE CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir, bool verify_files = true);

/// Checks a file of a checkpoint against the CRC-32 recorded in its metadata.json, returning its bytes.
DETTRIAL_INLINE std::string read_checked_file(const std::filesystem::path& dir, const std::string& name);

/// The complete checkpoints in a storage directory, oldest first (by write order). Hidden entries
/// (checkpoints being written or deleted) are not checkpoints.
DETTRIAL_INLINE std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& storage);

/**
 * @brief Resolves what a user names to resume from: a checkpoint directory itself, or a directory
 * holding checkpoints (a trial's storage, or its output directory with `checkpoints/`), whose most
 * recent checkpoint is taken. Throws CheckpointError when there is none.
 */
DETTRIAL_INLINE std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

/**
 * @brief The checkpoints `retention` lets go: all but the `save_trial_latest` most recent and the
 * `save_trial_best` best by their validation metric. `keep_uuid` (the newest, while a trial still
 * runs) is never chosen.
 */
DETTRIAL_INLINE std::vector<CheckpointInfo> checkpoints_to_delete(const std::vector<CheckpointInfo>& all, const Retention& retention,
                                                                  bool smaller_is_better, std::string_view keep_uuid = {});

/// Deletes a checkpoint: renamed to a hidden name first (atomic), so a crash half-way through
/// never leaves a directory that looks like a checkpoint but is not one.
DETTRIAL_INLINE void delete_checkpoint(const CheckpointInfo& checkpoint);

}  // namespace dettrial

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../detail/json.hpp"
#include <fstream>
#include <random>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dettrial::detail {

DETTRIAL_INLINE void write_file_synced(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create '" + path.string() + "': " + errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      ::close(fd);
      throw CheckpointError("cannot write '" + path.string() + "': " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw CheckpointError("cannot sync '" + path.string() + "' to disk: " + why);
  }
  if (::close(fd) != 0) throw CheckpointError("cannot close '" + path.string() + "': " + errno_text());
}

DETTRIAL_INLINE void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("cannot open directory '" + dir.string() + "': " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : std::string();
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot sync directory '" + dir.string() + "': " + why);
}

DETTRIAL_INLINE std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read '" + path.string() + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return std::move(bytes).str();
}

DETTRIAL_INLINE std::string new_uuid() {
  std::random_device device;
  std::uint64_t hi = (static_cast<std::uint64_t>(device()) << 32) | device();
  std::uint64_t lo = (static_cast<std::uint64_t>(device()) << 32) | device();
  hi = (hi & ~0xF000ULL) | 0x4000ULL;              // version 4
  lo = (lo & ~(0xC0ULL << 56)) | (0x80ULL << 56);  // RFC 4122 variant
  char text[37];
  std::snprintf(text, sizeof text, "%08llx-%04llx-%04llx-%04llx-%012llx", static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF), static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48), static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return text;
}

DETTRIAL_INLINE bool is_hidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name.front() == '.';
}

DETTRIAL_INLINE void remove_stale_entries(const std::filesystem::path& storage) {
  std::error_code ec;
  if (!std::filesystem::is_directory(storage, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(storage, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".deleting-", 0) == 0) std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE CheckpointWriter::CheckpointWriter(std::filesystem::path storage, std::string uuid, detail::WritePace* pace)
    : storage_(std::move(storage)), uuid_(std::move(uuid)), temp_(storage_ / (".tmp-" + uuid_)), pace_(pace) {
  std::error_code ec;
  std::filesystem::create_directories(storage_, ec);
  if (ec) throw CheckpointError("cannot create checkpoint storage '" + storage_.string() + "': " + ec.message());
  std::filesystem::create_directory(temp_, ec);
  if (ec) throw CheckpointError("cannot create '" + temp_.string() + "': " + ec.message());
}

DETTRIAL_INLINE CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(temp_, ec);
}

DETTRIAL_INLINE void CheckpointWriter::add_file(const std::string& name, std::string_view bytes) {
  add_file(name, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

DETTRIAL_INLINE void CheckpointWriter::add_file(const std::string& name, const std::function<void(const ByteSink&)>& produce) {
  const std::filesystem::path path = temp_ / name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create '" + path.string() + "': " + detail::errno_text());
  FileEntry entry{name, 0, 0};
  std::uint32_t crc = detail::crc32_of({});
  try {
    produce([&](const void* data, std::size_t size) {
      // In pieces of at most 4 MB, each checksummed while it is in the cache and paced.
      constexpr std::size_t piece = std::size_t{4} << 20;
      for (const char* bytes = static_cast<const char*>(data); size > 0;) {
        const std::size_t n = std::min(size, piece);
        crc = detail::crc32_continue(crc, {bytes, n});
        for (std::size_t done = 0; done < n;) {
          const ssize_t wrote = ::write(fd, bytes + done, n - done);
          if (wrote < 0 && errno == EINTR) continue;
          if (wrote < 0) throw CheckpointError("cannot write '" + path.string() + "': " + detail::errno_text());
          done += static_cast<std::size_t>(wrote);
        }
        entry.size += n;
        bytes += n;
        size -= n;
        if (pace_) pace_->wrote(n);
      }
    });
    if (::fsync(fd) != 0) throw CheckpointError("cannot sync '" + path.string() + "' to disk: " + detail::errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw CheckpointError("cannot close '" + path.string() + "': " + detail::errno_text());
  entry.crc32 = crc;
  files_.push_back(std::move(entry));
}

DETTRIAL_INLINE std::filesystem::path CheckpointWriter::commit(detail::Json fields) {
  const std::filesystem::path meta_path = CheckpointFolder{temp_}.metadata();
  if (!fields.is_object())
    throw CheckpointError("the fields of '" + meta_path.string() + "' must be a JSON object, not " + detail::json_kind(fields));
  fields.erase("files");
  detail::Json files = detail::Json::object();
  for (const FileEntry& file : files_) files[file.name] = {{"size", file.size}, {"crc32", file.crc32}};
  fields["files"] = std::move(files);
  detail::write_file_synced(meta_path, detail::json_text(fields));
  detail::sync_directory(temp_);
  const std::filesystem::path final_path = storage_ / uuid_;
  if (::rename(temp_.c_str(), final_path.c_str()) != 0)
    throw CheckpointError("cannot move checkpoint into place at '" + final_path.string() + "': " + detail::errno_text());
  committed_ = true;
  detail::sync_directory(storage_);
  return final_path;
}

}  // namespace dettrial

namespace dettrial::detail {
/// A checkpoint Determined wrote: its id is its folder's name (Determined's storage id), its place
/// its `steps_completed`; it lists no checksums (Determined keeps none).
DETTRIAL_INLINE CheckpointInfo determined_checkpoint_info(const std::filesystem::path& dir, const Json& meta) {
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  CheckpointInfo info{.path = dir, .uuid = dir.filename().string(), .by_determined = true};
  try {
    info.batches_trained = json_as<std::int64_t>(json_field(meta, "steps_completed"), "steps_completed");
  } catch (const JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' (written by Determined " + meta.value("determined_version", std::string("?")) +
                          ") has no usable steps_completed: " + e.what());
  }
  std::error_code ec;
  if (!std::filesystem::exists(CheckpointFolder{dir}.state_dict(), ec))
    throw CheckpointError("'" + dir.string() +
                          "' (written by Determined) has no state_dict.pth: only PyTorchTrial checkpoints can be continued");
  return info;
}
}  // namespace dettrial::detail

namespace dettrial {
DETTRIAL_INLINE CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir, bool verify_files) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) throw CheckpointError("checkpoint '" + dir.string() + "' does not exist");
  if (!std::filesystem::is_directory(dir, ec))
    throw CheckpointError("checkpoint '" + dir.string() + "' is not a directory (a checkpoint is a directory with metadata.json)");
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  if (!std::filesystem::exists(meta_path, ec))
    throw CheckpointError("'" + dir.string() + "' is not a complete dettrial checkpoint: it has no metadata.json");
  const detail::Json meta = detail::read_json_file<CheckpointError>(meta_path);
  auto field = [&](const char* key) -> const detail::Json& {
    const detail::Json* v = detail::json_find(meta, key);
    if (!v) throw CheckpointError("'" + meta_path.string() + "' has no '" + key + "'");
    return *v;
  };
  CheckpointInfo info;
  info.path = dir;
  if (!detail::json_find(meta, "dettrial_format") && detail::json_find(meta, "determined_version"))
    return detail::determined_checkpoint_info(dir, meta);
  try {
    const auto format = detail::json_as<std::int64_t>(field("dettrial_format"), "dettrial_format");
    if (format > checkpoint_format_version)
      throw CheckpointError("'" + meta_path.string() + "' is checkpoint format " + std::to_string(format) +
                            ", written by a newer dettrial; this one reads formats up to " + std::to_string(checkpoint_format_version));
    info.format = format;
    info.uuid = detail::json_as<std::string>(field("uuid"), "uuid");
    info.batches_trained = detail::json_as<std::int64_t>(field("steps_completed"), "steps_completed");
    info.epochs_trained = detail::json_as<std::int64_t>(field("epochs_trained"), "epochs_trained");
    info.sequence = detail::json_as<std::int64_t>(field("sequence"), "sequence");
    if (const detail::Json* v = detail::json_find(meta, "validation_metric"); v && !v->is_null())
      info.validation_metric = detail::json_as<double>(*v, "validation_metric");
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' has a field of the wrong type: " + e.what());
  }
  if (verify_files) {
    const detail::Json* files = detail::json_find(meta, "files");
    if (!files || !files->is_object()) throw CheckpointError("'" + meta_path.string() + "' lists no files");
    for (auto it = files->begin(); it != files->end(); ++it) {
      const std::filesystem::path file = dir / it.key();
      if (!std::filesystem::exists(file, ec)) throw CheckpointError("checkpoint file '" + file.string() + "' is missing");
      std::uint64_t size = 0;
      try {
        size = detail::json_as<std::uint64_t>(detail::json_field(it.value(), "size"), "files." + it.key() + ".size");
      } catch (const detail::JsonFieldError& e) {
        throw CheckpointError("'" + meta_path.string() + "' has a bad entry for file '" + it.key() + "': " + e.what());
      }
      const auto actual = std::filesystem::file_size(file, ec);
      if (ec || actual != size)
        throw CheckpointError("checkpoint file '" + file.string() + "' is truncated or damaged: " + std::to_string(actual) +
                              " bytes where " + std::to_string(size) + " were written");
    }
  }
  return info;
}

DETTRIAL_INLINE std::string read_checked_file(const std::filesystem::path& dir, const std::string& name) {
  const std::filesystem::path file = dir / name;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw CheckpointError("checkpoint file '" + file.string() + "' is missing");
  std::string bytes = detail::read_file_bytes(file);
  const std::filesystem::path meta_path = CheckpointFolder{dir}.metadata();
  const detail::Json meta = detail::read_json_file<CheckpointError>(meta_path);
  const detail::Json* files = detail::json_find(meta, "files");
  const detail::Json* entry = files ? detail::json_find(*files, name) : nullptr;
  if (!entry) throw CheckpointError("'" + meta_path.string() + "' does not list '" + name + "'");
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
  try {
    size = detail::json_as<std::uint64_t>(detail::json_field(*entry, "size"), "files." + name + ".size");
    crc32 = detail::json_as<std::uint32_t>(detail::json_field(*entry, "crc32"), "files." + name + ".crc32");
  } catch (const detail::JsonFieldError& e) {
    throw CheckpointError("'" + meta_path.string() + "' has a bad entry for file '" + name + "': " + e.what());
  }
  if (size != bytes.size() || crc32 != detail::crc32_of(bytes))
    throw CheckpointError("checkpoint file '" + file.string() + "' is damaged: its size or CRC-32 differs from what was written");
  return bytes;
}

DETTRIAL_INLINE std::vector<CheckpointInfo> list_checkpoints(const std::filesystem::path& storage) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(storage, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(storage, ec)) {
    if (!entry.is_directory() || detail::is_hidden(entry.path())) continue;
    if (!std::filesystem::exists(CheckpointFolder{entry.path()}.metadata(), ec)) continue;
    out.push_back(read_checkpoint_info(entry.path(), /*verify_files=*/false));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
  return out;
}

DETTRIAL_INLINE std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(CheckpointFolder{path}.metadata(), ec)) return path;
  if (!std::filesystem::exists(path, ec)) throw CheckpointError("checkpoint '" + path.string() + "' does not exist");
  for (const auto& storage : {path, RunFolder{path}.checkpoints()}) {
    const auto all = list_checkpoints(storage);
    if (!all.empty()) return all.back().path;
  }
  throw CheckpointError("'" + path.string() + "' holds no complete dettrial checkpoint (a directory with metadata.json)");
}

DETTRIAL_INLINE std::vector<CheckpointInfo> checkpoints_to_delete(const std::vector<CheckpointInfo>& all, const Retention& retention,
                                                                  bool smaller_is_better, std::string_view keep_uuid) {
  std::vector<bool> keep(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].uuid == keep_uuid) keep[i] = true;
    if (static_cast<std::int64_t>(all.size() - i) <= retention.save_trial_latest) keep[i] = true;
  }
  std::vector<std::size_t> ranked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].validation_metric) ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(), [&](std::size_t a, std::size_t b) {
    return MetricOrder{smaller_is_better}.better(*all[a].validation_metric, *all[b].validation_metric);
  });
  for (std::size_t k = 0; k < ranked.size() && static_cast<std::int64_t>(k) < retention.save_trial_best; ++k) keep[ranked[k]] = true;
  std::vector<CheckpointInfo> out;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!keep[i]) out.push_back(all[i]);
  return out;
}

DETTRIAL_INLINE void delete_checkpoint(const CheckpointInfo& checkpoint) {
  const std::filesystem::path doomed = checkpoint.path.parent_path() / (".deleting-" + checkpoint.uuid);
  if (::rename(checkpoint.path.c_str(), doomed.c_str()) != 0)
    throw CheckpointError("cannot delete checkpoint '" + checkpoint.path.string() + "': " + detail::errno_text());
  std::error_code ec;
  std::filesystem::remove_all(doomed, ec);
}

}  // namespace dettrial

#endif  // DETTRIAL_HEADER_DEFINITIONS
