// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A JSON-lines file (events.jsonl, metrics.jsonl): appended by one process, read whole or
/// followed by others, its last line possibly torn by a crash. The one place that rule lives.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "json_fwd.hpp"
#include "linkage.hpp"

namespace dettrial::detail {

/// A .jsonl file: one JSON object per line. A last line without its newline is torn (a writer
/// killed while writing it): readers leave it out, and a writer cuts it off before appending.
class JsonlFile {
 public:
  explicit JsonlFile(std::filesystem::path path) : path_(std::move(path)) {}
  const std::filesystem::path& path() const { return path_; }

  /// Appends `record` as one line (flushed when this returns).
  void append(const Json& record) const;

  /**
   * @brief The objects, one per line (blank lines skipped). A last line that is not one (torn by a
   * crash) is left out and `*torn` set; any other is an Error naming the file and the line number.
   */
  std::vector<Json> read(bool* torn = nullptr) const;

  /// The same rule for lines from `in` (a file already open, or bytes held in memory), its errors
  /// naming it `name`.
  static std::vector<Json> read(std::istream& in, const std::string& name, bool* torn = nullptr);

  /**
   * @brief Rewrites the file (a new one renamed over it, so a crash leaves the old or the new)
   * with only the records `keep` accepts, in order; a torn last line goes too. Returns how many
   * lines it dropped; the file is left untouched when none. Read as `read` reads.
   */
  std::size_t keep_only(const std::function<bool(const Json&)>& keep) const;

  /// Cuts a torn last line off, so that the next append starts a line of its own instead of being
  /// lost with it; true when it cut one. A missing file is left alone.
  bool cut_torn_line() const;

 private:
  std::filesystem::path path_;
};

/**
 * @brief Follows a .jsonl file another process appends to: each read returns the complete lines
 * added since the last read (a line still being written waits for the next one), as objects; a
 * line that does not parse is skipped. The file is followed by inode and offset: one replaced or
 * shortened (a resumed trial rewrites its metrics.jsonl) is read again from its start.
 */
class JsonlTail {
 public:
  std::vector<Json> read_new(const std::filesystem::path& path);

 private:
  std::uintmax_t offset_ = 0;
  ino_t inode_ = 0;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <string>

#include "../error.hpp"
#include "atomic_file.hpp"
#include "json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void JsonlFile::append(const Json& record) const {
  std::ofstream out(path_, std::ios::app | std::ios::binary);
  out << json_line(record);
  out.flush();
  if (!out) throw Error("cannot append to '" + path_.string() + "'");
}

DETTRIAL_INLINE std::vector<Json> JsonlFile::read(bool* torn) const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw Error("cannot read '" + path_.string() + "'");
  return read(in, path_.string(), torn);
}

DETTRIAL_INLINE std::vector<Json> JsonlFile::read(std::istream& in, const std::string& name, bool* torn) {
  if (torn) *torn = false;
  std::vector<Json> out;
  // A line that is not a record is fatal only once another line follows it: the last may be torn.
  std::string bad_reason;
  std::size_t bad_line = 0, number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (bad_line != 0)
      throw Error("'" + name + "' line " + std::to_string(bad_line) + " is not a JSON record (" + bad_reason +
                  "); the file is damaged: fix or delete that line");
    try {
      Json record = Json::parse(line);
      if (record.is_object()) {
        out.push_back(std::move(record));
        continue;
      }
      bad_reason = "it is " + json_kind(record) + ", not an object";
    } catch (const Json::exception& e) {
      bad_reason = json_parse_reason(e);
    }
    bad_line = number;
  }
  if (in.bad()) throw Error("cannot read '" + name + "'");
  if (bad_line != 0 && torn) *torn = true;
  return out;
}

DETTRIAL_INLINE std::size_t JsonlFile::keep_only(const std::function<bool(const Json&)>& keep) const {
  bool torn = false;
  const std::vector<Json> records = read(&torn);
  std::string kept;
  std::size_t dropped = torn ? 1 : 0;
  for (const Json& record : records) {
    if (keep(record)) kept += json_line(record);
    else ++dropped;
  }
  if (dropped != 0) write_atomically(path_, kept);
  return dropped;
}

DETTRIAL_INLINE bool JsonlFile::cut_torn_line() const {
  std::ifstream whole(path_, std::ios::binary);
  if (!whole) return false;
  const std::string text((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  if (text.empty() || text.back() == '\n') return false;
  const auto keep = text.rfind('\n');
  std::filesystem::resize_file(path_, keep == std::string::npos ? 0 : keep + 1);
  return true;
}

DETTRIAL_INLINE std::vector<Json> JsonlTail::read_new(const std::filesystem::path& path) {
  std::vector<Json> out;
  struct stat file{};
  if (::stat(path.c_str(), &file) != 0) return out;
  if (file.st_ino != inode_ || static_cast<std::uintmax_t>(file.st_size) < offset_) {
    inode_ = file.st_ino;  // a new file: read from its start
    offset_ = 0;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  in.seekg(static_cast<std::streamoff>(offset_));
  for (std::string line; std::getline(in, line);) {
    if (in.eof()) break;  // a line still being written: read it next time
    offset_ += line.size() + 1;
    Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded() && record.is_object()) out.push_back(std::move(record));
  }
  return out;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
