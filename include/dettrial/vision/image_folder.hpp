// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Image files with labels: torchvision's ImageFolder (one subfolder per class), or an
/// explicit list of (path, label) pairs, in code or in a CSV file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../detail/linkage.hpp"
#include "decode.hpp"
#include "image.hpp"

namespace dettrial::vision {

/// torchvision's IMG_EXTENSIONS: the files ImageFolder lists by default, so the records are
/// torchvision's (dettrial decodes the JPEG, PNG and WebP ones and refuses a listing with the others).
inline const std::vector<std::string>& default_image_extensions() {
  static const std::vector<std::string> extensions{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return extensions;
}

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// The file name endings listed, compared in lower case (torchvision's `extensions`).
  std::vector<std::string> extensions = default_image_extensions();
  /// Allow a class folder with no such file (torchvision's `allow_empty`); otherwise an error names them.
  bool allow_empty = false;
};

/**
 * @brief Labelled image files, as torchvision's `ImageFolder` lists them: the classes are the
 * subfolders of `root` (symbolic links followed), sorted, indexed from 0; the records are every file
 * with a listed extension anywhere below a class folder, folder by folder in sorted path order, each
 * folder's files sorted. So a record's index and label are the ones torchvision gives it.
 * @code{.cpp}
 * dettrial::vision::ImageFolder train("data/train");   // data/train/cat/1.png, data/train/dog/2.jpg, ...
 * train.classes();                                      // {"cat", "dog"}
 * @endcode
 */
class ImageFolder {
 public:
  struct Sample {
    std::filesystem::path path;
    std::int64_t label = 0;
  };

  explicit ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options = {});
  /// An explicit list of files and labels; `classes` names the labels (optional).
  static ImageFolder from_samples(std::vector<Sample> samples, std::vector<std::string> classes = {});
  /**
   * @brief The samples of a CSV file with a `path` and a `label` column (a header line naming them, in
   * any order, or no header: path then label). Relative paths are relative to the CSV file's folder.
   * Labels are integers, or class names, which are then sorted and indexed as ImageFolder's classes.
   */
  static ImageFolder from_csv(const std::filesystem::path& csv);

  std::int64_t size() const { return static_cast<std::int64_t>(samples_.size()); }
  const std::vector<Sample>& samples() const { return samples_; }
  /// The class names, in label order (empty for integer labels given without names).
  const std::vector<std::string>& classes() const { return classes_; }
  std::int64_t label(std::int64_t index) const { return samples_[static_cast<std::size_t>(index)].label; }
  /// Reads and decodes record `index` (thread-safe).
  Image load(std::int64_t index, ImageMode mode) const { return read_image(samples_[static_cast<std::size_t>(index)].path, mode); }
  /// Record `index`'s window that `choose` picks from its size: a JPEG decodes only that (read_image_window).
  Image load_window(std::int64_t index, ImageMode mode, WindowChooser choose) const {
    return read_image_window(samples_[static_cast<std::size_t>(index)].path, mode, choose);
  }
  /// The record's file, for messages.
  std::string name(std::int64_t index) const { return samples_[static_cast<std::size_t>(index)].path.string(); }

 private:
  ImageFolder() = default;
  std::vector<Sample> samples_;
  std::vector<std::string> classes_;
};

}  // namespace dettrial::vision

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <system_error>

namespace dettrial::detail {

/// `text` in lower case (ASCII: file name endings).
inline std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return text;
}

inline bool has_extension(const std::string& file, const std::vector<std::string>& extensions) {
  const std::string lower = lowercase(file);
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) {
    return lower.size() >= e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0;
  });
}

/// os.walk(top, followlinks=True): every folder below `top` (itself included) with its entries that
/// are not folders (broken links included), as (path text, file names); a link cycle is walked once.
inline void walk(const std::string& top, std::vector<std::pair<std::string, std::vector<std::string>>>& out,
                 std::set<std::filesystem::path>& seen) {
  std::error_code ec;
  const auto canonical = std::filesystem::canonical(top, ec);
  if (ec || !seen.insert(canonical).second) return;
  std::vector<std::string> files, folders;
  for (std::filesystem::directory_iterator it(top, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    (it->is_directory(kind) ? folders : files).push_back(it->path().filename().string());
  }
  if (ec) throw DataError("ImageFolder: cannot list '" + top + "': " + ec.message());
  out.emplace_back(top, std::move(files));
  for (const std::string& folder : folders) walk(top + "/" + folder, out, seen);
}

/// One CSV line's fields (RFC 4180 quotes: "a,b" and "" inside them).
inline std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;
      else if (ch == '"') quoted = false;
      else fields.back() += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      fields.emplace_back();
    } else if (ch != '\r') {
      fields.back() += ch;
    }
  }
  return fields;
}

inline bool is_integer(const std::string& text) {
  std::size_t i = text.size() > 1 && text[0] == '-' ? 1 : 0;
  if (i == text.size()) return false;
  for (; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

/// The ending of `file` in lower case when it names an image kind this build cannot decode: BMP,
/// TIFF, PPM/PGM and GIF, and JPEG, PNG or WebP where their library was not found; else empty.
inline std::string undecodable_ending(const std::string& file) {
  const std::string lower = lowercase(std::filesystem::path(file).extension().string());
  const bool readable = ((lower == ".jpg" || lower == ".jpeg") && vision::decodes_jpeg) || (lower == ".png" && vision::decodes_png) ||
                        (lower == ".webp" && vision::decodes_webp);
  const auto& listed = vision::default_image_extensions();
  const bool image = lower == ".gif" || std::find(listed.begin(), listed.end(), lower) != listed.end();  // and GIF, which a user may list
  return !readable && image ? lower : std::string();
}

/// Refuses a listing that holds files this build cannot decode, before any training: one sentence
/// with how many of each ending (the file's content decides the decoder, so a PNG named .JPEG is read).
inline void check_decodable(const std::vector<vision::ImageFolder::Sample>& samples, const std::string& where) {
  std::map<std::string, std::int64_t> counts;
  std::string first;
  for (const auto& sample : samples) {
    const std::string ending = undecodable_ending(sample.path.filename().string());
    if (ending.empty()) continue;
    if (first.empty()) first = sample.path.string();
    ++counts[ending];
  }
  if (counts.empty()) return;
  std::int64_t total = 0;
  std::string kinds;
  for (const auto& [ending, n] : counts) {
    total += n;
    kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + ending;
  }
  std::string decoded =
      std::string(vision::decodes_jpeg ? " JPEG" : "") + (vision::decodes_png ? " PNG" : "") + (vision::decodes_webp ? " WebP" : "");
  throw DataError("ImageFolder: " + std::to_string(total) + " file(s) listed in " + where + " are of kinds this build cannot decode (" +
                  kinds + "; the first: '" + first + "'); it decodes" + (decoded.empty() ? std::string(" none") : decoded) +
                  ": convert them, or list without their endings (ImageFolderOptions::extensions)");
}

}  // namespace dettrial::detail

namespace dettrial::vision {
DETTRIAL_INLINE ImageFolder::ImageFolder(const std::filesystem::path& root, const ImageFolderOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec))
    throw DataError("ImageFolder: '" + root.string() + "' is not a folder (expected one subfolder per class)");
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    if (it->is_directory(kind)) classes_.push_back(it->path().filename().string());
  }
  if (ec) throw DataError("ImageFolder: cannot list '" + root.string() + "': " + ec.message());
  if (classes_.empty()) throw DataError("ImageFolder: found no class folder in '" + root.string() + "'");
  std::sort(classes_.begin(), classes_.end());
  std::vector<std::string> empty;
  for (std::size_t label = 0; label < classes_.size(); ++label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> folders;
    std::set<std::filesystem::path> seen;
    detail::walk((root / classes_[label]).string(), folders, seen);
    std::sort(folders.begin(), folders.end());
    const std::size_t before = samples_.size();
    for (auto& [folder, files] : folders) {
      std::sort(files.begin(), files.end());
      for (const std::string& file : files)
        if (detail::has_extension(file, options.extensions))
          samples_.push_back({std::filesystem::path(folder) / file, static_cast<std::int64_t>(label)});
    }
    if (samples_.size() == before) empty.push_back(classes_[label]);
  }
  detail::check_decodable(samples_, "'" + root.string() + "'");
  if (!empty.empty() && !options.allow_empty) {
    std::string names, endings;
    for (const auto& n : empty) names += (names.empty() ? "" : ", ") + n;
    for (const auto& e : options.extensions) endings += (endings.empty() ? "" : " ") + e;
    throw DataError("ImageFolder: found no image file for the class(es) " + names + " in '" + root.string() +
                    "' (listed endings: " + endings + "; allow_empty accepts empty classes)");
  }
}

DETTRIAL_INLINE ImageFolder ImageFolder::from_samples(std::vector<Sample> samples, std::vector<std::string> classes) {
  ImageFolder folder;
  for (const Sample& s : samples)
    if (s.label < 0 || (!classes.empty() && s.label >= static_cast<std::int64_t>(classes.size())))
      throw DataError("ImageFolder: '" + s.path.string() + "' has label " + std::to_string(s.label) + ", outside the " +
                      (classes.empty() ? std::string("non-negative integers") : std::to_string(classes.size()) + " classes"));
  folder.samples_ = std::move(samples);
  folder.classes_ = std::move(classes);
  return folder;
}

DETTRIAL_INLINE ImageFolder ImageFolder::from_csv(const std::filesystem::path& csv) {
  std::ifstream in(csv);
  if (!in) throw DataError("ImageFolder: cannot open the CSV file '" + csv.string() + "'");
  std::vector<std::pair<std::string, std::string>> rows;
  std::string line;
  std::size_t path_column = 0, label_column = 1, number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line == "\r") continue;
    const auto fields = detail::csv_fields(line);
    if (rows.empty() && number == 1) {
      const auto path_at = std::find(fields.begin(), fields.end(), "path");
      const auto label_at = std::find(fields.begin(), fields.end(), "label");
      if (path_at != fields.end() && label_at != fields.end()) {
        path_column = static_cast<std::size_t>(path_at - fields.begin());
        label_column = static_cast<std::size_t>(label_at - fields.begin());
        continue;
      }
    }
    if (fields.size() <= std::max(path_column, label_column))
      throw DataError("ImageFolder: line " + std::to_string(number) + " of '" + csv.string() + "' has " + std::to_string(fields.size()) +
                      " field(s); it needs a path and a label");
    rows.emplace_back(fields[path_column], fields[label_column]);
  }
  if (rows.empty()) throw DataError("ImageFolder: the CSV file '" + csv.string() + "' lists no image");
  const bool numeric = std::all_of(rows.begin(), rows.end(), [](const auto& r) { return detail::is_integer(r.second); });
  std::vector<std::string> classes;
  std::map<std::string, std::int64_t> index;
  if (!numeric) {
    std::set<std::string> names;
    for (const auto& r : rows) names.insert(r.second);
    classes.assign(names.begin(), names.end());
    for (std::size_t i = 0; i < classes.size(); ++i) index[classes[i]] = static_cast<std::int64_t>(i);
  }
  std::vector<Sample> samples;
  samples.reserve(rows.size());
  for (const auto& [path, label] : rows) {
    const std::filesystem::path p(path);
    samples.push_back({p.is_absolute() ? p : csv.parent_path() / p, numeric ? std::stoll(label) : index.at(label)});
  }
  detail::check_decodable(samples, "the CSV file '" + csv.string() + "'");
  return from_samples(std::move(samples), std::move(classes));
}

}  // namespace dettrial::vision

#endif  // DETTRIAL_HEADER_DEFINITIONS
