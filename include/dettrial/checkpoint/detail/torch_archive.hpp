// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The zip container of a torch.save archive, checked before LibTorch's reader opens it:
/// every record stored (not compressed) inside the file, named inside one folder, once.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// A record of a torch.save archive: its name and where its bytes lie in the file.
struct ArchiveRecord {
  std::string name;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

/**
 * @brief The records of a torch.save archive's zip container (ZIP64 included), or a
 * std::runtime_error saying what is wrong with it. torch.save writes each record stored, whole,
 * inside one top folder; LibTorch's reader (miniz) trusts the sizes the central directory claims
 * and allocates them before reading. Refused here, before it runs: a central directory that is
 * missing, truncated or outside the file; a record that is compressed (a zip bomb's way: an
 * allocation of any size from a few bytes), encrypted, split over disks, whose sizes disagree, or
 * whose bytes lie outside the file; a name that is empty, absolute, climbs out (`..`), holds a
 * backslash or a NUL, or is outside the archive's one top folder; a name given twice.
 */
DETTRIAL_INLINE std::vector<ArchiveRecord> torch_archive_records(std::string_view bytes);

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <set>
#include <stdexcept>

namespace dettrial::detail::torch_archive {

/// Little-endian fields at `at` of `bytes`, checked to lie inside it.
class Fields {
 public:
  explicit Fields(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t get(std::uint64_t at, int width, const char* what) const {
    if (at > bytes_.size() || static_cast<std::uint64_t>(width) > bytes_.size() - at)
      throw std::runtime_error(std::string("the zip container is truncated: its ") + what + " lies past the end of the file");
    std::uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes_[at + i])) << (8 * i);
    return v;
  }
  std::string_view text(std::uint64_t at, std::uint64_t n, const char* what) const {
    if (at > bytes_.size() || n > bytes_.size() - at)
      throw std::runtime_error(std::string("the zip container is truncated: its ") + what + " lies past the end of the file");
    return bytes_.substr(at, n);
  }
  std::uint64_t size() const { return bytes_.size(); }

 private:
  std::string_view bytes_;
};

constexpr std::uint32_t end_signature = 0x06054b50, zip64_end_signature = 0x06064b50, zip64_locator_signature = 0x07064b50;
constexpr std::uint32_t central_signature = 0x02014b50, local_signature = 0x04034b50;

/// Why a record's name is refused, or nullptr.
inline const char* bad_name(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.front() == '/') return "is absolute";
  if (name.find('\\') != std::string_view::npos) return "holds a backslash";
  if (name.find('\0') != std::string_view::npos) return "holds a NUL";
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t end = std::min(name.find('/', start), name.size());
    if (name.substr(start, end - start) == "..") return "climbs out of the archive ('..')";
    start = end + 1;
  }
  return nullptr;
}

/// The central directory's place: {offset, size, entries}, from the end record (ZIP64's where its
/// fields overflow).
struct Directory {
  std::uint64_t offset = 0, size = 0, entries = 0;
};

inline Directory find_directory(const Fields& f) {
  // The end record is the last 22 bytes but for a comment of at most 65,535 bytes.
  if (f.size() < 22) throw std::runtime_error("not a zip container (shorter than a zip's end record)");
  std::uint64_t end = f.size() - 22;
  const std::uint64_t lowest = f.size() > 22 + 65535 ? f.size() - 22 - 65535 : 0;
  while (f.get(end, 4, "end record") != end_signature) {
    if (end == lowest) throw std::runtime_error("not a zip container (no end of central directory record: a truncated file?)");
    --end;
  }
  if (f.get(end + 4, 2, "end record") != 0 || f.get(end + 6, 2, "end record") != 0)
    throw std::runtime_error("the zip container is split over several disks");
  Directory d{f.get(end + 16, 4, "end record"), f.get(end + 12, 4, "end record"), f.get(end + 10, 2, "end record")};
  if (d.offset == 0xFFFFFFFF || d.size == 0xFFFFFFFF || d.entries == 0xFFFF) {
    if (end < 20 || f.get(end - 20, 4, "ZIP64 locator") != zip64_locator_signature)
      throw std::runtime_error("the zip container's end record points to a ZIP64 record that is not there");
    const std::uint64_t record = f.get(end - 20 + 8, 8, "ZIP64 locator");
    if (f.get(record, 4, "ZIP64 end record") != zip64_end_signature)
      throw std::runtime_error("the zip container's ZIP64 end record is not where its locator says");
    d = {f.get(record + 48, 8, "ZIP64 end record"), f.get(record + 40, 8, "ZIP64 end record"), f.get(record + 32, 8, "ZIP64 end record")};
    end = record;
  }
  if (d.offset > end || d.size > end - d.offset)
    throw std::runtime_error("the zip container's central directory lies outside the file (a truncated file?)");
  if (d.entries > d.size / 46) throw std::runtime_error("the zip container's central directory is shorter than its record count");
  return d;
}

}  // namespace dettrial::detail::torch_archive

namespace dettrial::detail {

DETTRIAL_INLINE std::vector<ArchiveRecord> torch_archive_records(std::string_view bytes) {
  namespace za = torch_archive;
  const za::Fields f(bytes);
  const za::Directory dir = za::find_directory(f);
  std::vector<ArchiveRecord> records;
  records.reserve(static_cast<std::size_t>(dir.entries));
  std::set<std::string_view> names;
  std::string_view folder;
  std::uint64_t at = dir.offset;
  for (std::uint64_t i = 0; i < dir.entries; ++i) {
    if (f.get(at, 4, "central directory") != za::central_signature)
      throw std::runtime_error("the zip container's central directory is damaged (entry " + std::to_string(i) + ")");
    const std::uint64_t flags = f.get(at + 8, 2, "central directory"), method = f.get(at + 10, 2, "central directory");
    std::uint64_t compressed = f.get(at + 20, 4, "central directory"), size = f.get(at + 24, 4, "central directory");
    const std::uint64_t name_length = f.get(at + 28, 2, "central directory"), extra_length = f.get(at + 30, 2, "central directory");
    const std::uint64_t comment_length = f.get(at + 32, 2, "central directory");
    std::uint64_t disk = f.get(at + 34, 2, "central directory"), local = f.get(at + 42, 4, "central directory");
    const std::string_view name = f.text(at + 46, name_length, "central directory");
    const std::string shown = "record '" + std::string(name.substr(0, 200)) + "'";
    // ZIP64's extra field holds, in order, each 32-bit field that overflowed.
    const std::string_view extra = f.text(at + 46 + name_length, extra_length, "central directory");
    for (std::size_t e = 0; e + 4 <= extra.size();) {
      const za::Fields x(extra);
      const std::uint64_t id = x.get(e, 2, "extra field"), length = x.get(e + 2, 2, "extra field");
      if (id == 0x0001) {
        std::uint64_t p = e + 4;
        for (std::uint64_t* field : {&size, &compressed, &local}) {
          if (*field == 0xFFFFFFFF && p + 8 <= e + 4 + length) {
            *field = x.get(p, 8, "ZIP64 extra field");
            p += 8;
          }
        }
        if (disk == 0xFFFF && p + 4 <= e + 4 + length) disk = x.get(p, 4, "ZIP64 extra field");
      }
      e += 4 + length;
    }
    if (const char* why = za::bad_name(name)) throw std::runtime_error("the zip container's " + shown + " " + why);
    const std::string_view top = name.substr(0, name.find('/'));
    if (i == 0) folder = top;
    if (top == name || top != folder)
      throw std::runtime_error("the zip container's " + shown + " is not inside the archive's folder '" + std::string(folder) +
                               "/' (torch.save writes every record there)");
    if (!names.insert(name).second) throw std::runtime_error("the zip container names " + shown + " twice");
    if (flags & 1) throw std::runtime_error("the zip container's " + shown + " is encrypted");
    if (method != 0)
      throw std::runtime_error("the zip container's " + shown + " is compressed (method " + std::to_string(method) +
                               "): torch.save stores records uncompressed, and a compressed one could inflate to any size");
    if (compressed != size)
      throw std::runtime_error("the zip container's " + shown + " claims " + std::to_string(size) + " bytes stored in " +
                               std::to_string(compressed));
    if (disk != 0) throw std::runtime_error("the zip container is split over several disks");
    // The record's bytes follow its local header, and lie before the central directory.
    if (f.get(local, 4, "local header") != za::local_signature)
      throw std::runtime_error("the zip container's " + shown + " has no local header where the central directory says");
    const std::uint64_t local_name = f.get(local + 26, 2, "local header"), local_extra = f.get(local + 28, 2, "local header");
    if (f.text(local + 30, local_name, "local header") != name)
      throw std::runtime_error("the zip container's " + shown + " has another name in its local header");
    const std::uint64_t data = local + 30 + local_name + local_extra;
    if (data > dir.offset || size > dir.offset - data)
      throw std::runtime_error("the zip container's " + shown + " claims " + std::to_string(size) +
                               " bytes, more than the file holds before its central directory");
    records.push_back({std::string(name), data, size});
    at += 46 + name_length + extra_length + comment_length;
  }
  if (at > dir.offset + dir.size) throw std::runtime_error("the zip container's central directory is longer than its end record says");
  return records;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
