// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The JSON dettrial writes and reads (metrics lines, events, checkpoint metadata, summaries),
/// with nlohmann/json.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "../error.hpp"
#include "json_fwd.hpp"
#include "linkage.hpp"

namespace dettrial::detail {

// ---- writing: nlohmann/json's dump; numbers as it writes them (shortest text that reads back exactly,
// 1.0 as `1.0`), NaN and infinities (which JSON lacks) as null, bytes that are not UTF-8 as U+FFFD.

/// One compact line, as in metrics.jsonl and events.jsonl: `{"type":"training","batches":3}` and a newline.
inline std::string json_line(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n"; }

/// The text of a JSON file (metadata.json, trial_state.json, load_data.json, summary.json), indented.
inline std::string json_text(const Json& j) { return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n"; }

/// A YAML document as JSON: maps, sequences, and plain scalars typed by YAML's core schema (null,
/// booleans, integers, finite floats); quoted scalars (tag "!") and everything else (`.inf`, `.nan`,
/// text) stay strings. A map's keys are their scalar text.
DETTRIAL_INLINE Json yaml_to_json(const YAML::Node& node);

// ---- reading ---------------------------------------------------------------------------------

/// Why nlohmann/json's parser refused a text, without its "[json.exception...]" tag and, for a
/// syntax error, without the place (callers say where): "syntax error while parsing value ...",
/// "number overflow parsing '1e99999'" (a number past a double's range is an out_of_range, not a
/// parse_error: a reader that caught only the latter let it through).
inline std::string json_parse_reason(const Json::exception& e) {
  std::string what = e.what();
  if (const auto tag_end = what.find("] "); what.starts_with("[json.exception.") && tag_end != std::string::npos)
    what.erase(0, tag_end + 2);
  if (dynamic_cast<const Json::parse_error*>(&e) != nullptr)
    if (const auto colon = what.find(": "); colon != std::string::npos) what.erase(0, colon + 2);
  return what;
}

/// Reads a JSON file written by dettrial; a missing or unparsable file is an ErrorT naming it:
/// "cannot read '<path>'", "'<path>' is not valid JSON (line N): <reason>".
template <class ErrorT = Error>
Json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path, ec)) throw ErrorT("cannot read '" + path.string() + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ErrorT("cannot read '" + path.string() + "'");
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    // A syntax error's byte (1-based, where the parser stopped) gives the line; a number out of
    // range has none.
    std::string where;
    if (const auto* syntax = dynamic_cast<const Json::parse_error*>(&e)) {
      const std::size_t at = std::min<std::size_t>(syntax->byte > 0 ? syntax->byte - 1 : 0, text.size());
      where = " (line " + std::to_string(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n')) + ")";
    }
    throw ErrorT("'" + path.string() + "' is not valid JSON" + where + ": " + json_parse_reason(e));
  }
}

/// A field of a JSON document that is missing or has the wrong type, as `json_field` and `json_as`
/// report it ("no 'uuid'", "'uuid' is a number, not a string"); readers turn it into their own
/// error naming the file.
struct JsonFieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `object[key]`, or nullptr when `object` is not an object or lacks `key`.
DETTRIAL_INLINE const Json* json_find(const Json& object, const std::string& key);

/// `object[key]`; a missing key throws JsonFieldError("no '<key>'").
DETTRIAL_INLINE const Json& json_field(const Json& object, const std::string& key);

/// "a string", "a number", "null", ...: what a JSON value is, for messages.
DETTRIAL_INLINE std::string json_kind(const Json& j);

/**
 * @brief `value` (named `field` in messages) as a T, strictly: integral types only from JSON
 * integers within their range, floating point from any JSON number, strings from strings, bool
 * from true and false. Anything else throws JsonFieldError("'<field>' is a string, not an integer").
 */
template <class T>
T json_as(const Json& value, std::string_view field) {
  const auto wrong = [&](const std::string& expected) {
    return JsonFieldError("'" + std::string(field) + "' is " + json_kind(value) + ", not " + expected);
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) throw wrong("true or false");
    return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (value.is_number_unsigned()) {
      if (const auto u = value.get<std::uint64_t>(); std::in_range<T>(u)) return static_cast<T>(u);
    } else if (value.is_number_integer()) {
      if (const auto i = value.get<std::int64_t>(); std::in_range<T>(i)) return static_cast<T>(i);
    } else {
      throw wrong(std::is_signed_v<T> ? "an integer" : "a non-negative integer");
    }
    throw JsonFieldError("'" + std::string(field) + "' is " + value.dump() + ", out of range");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) throw wrong("a number");
    return value.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) throw wrong("a string");
    return value.get<std::string>();
  } else {
    static_assert(std::is_same_v<T, std::string>, "json_as reads bool, integers, floating point and std::string");
  }
}

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
namespace dettrial::detail {

DETTRIAL_INLINE Json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: return nullptr;
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = yaml_to_json(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() != "!") {  // "!" marks a quoted scalar: always a string
        if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
        if (s == "true" || s == "True" || s == "TRUE") return true;
        if (s == "false" || s == "False" || s == "FALSE") return false;
        std::int64_t i = 0;
        double d = 0;
        if (YAML::convert<std::int64_t>::decode(node, i)) return i;
        if (YAML::convert<double>::decode(node, d) && std::isfinite(d)) return d;
      }
      return s;
    }
  }
  return nullptr;
}

DETTRIAL_INLINE const Json* json_find(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

DETTRIAL_INLINE const Json& json_field(const Json& object, const std::string& key) {
  if (const Json* v = json_find(object, key)) return *v;
  throw JsonFieldError("no '" + key + "'");
}

DETTRIAL_INLINE std::string json_kind(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    default: return std::string("a ") + j.type_name();
  }
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
