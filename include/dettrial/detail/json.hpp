// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Writing JSON (metrics lines, checkpoint metadata) and reading it back with yaml-cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "error.hpp"

namespace dettrial::detail {

// dettrial's fixed package set has no JSON library, and what it writes is small: metric lines and
// checkpoint metadata. Writing is a few lines here; reading uses yaml-cpp (JSON is YAML 1.2 flow style).
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}
inline void append_json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}
inline void append_json_integer(std::string& out, std::int64_t v) { out += std::to_string(v); }

/// A YAML document as JSON: maps, sequences, and plain scalars typed by YAML's core schema (null,
/// booleans, integers, floats); quoted scalars and everything else stay strings.
inline void append_yaml_as_json(std::string& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: out += "null"; return;
    case YAML::NodeType::Sequence: {
      out += '[';
      bool first = true;
      for (const auto& item : node) {
        if (!first) out += ", ";
        first = false;
        append_yaml_as_json(out, item);
      }
      out += ']';
      return;
    }
    case YAML::NodeType::Map: {
      out += '{';
      bool first = true;
      for (const auto& kv : node) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, kv.first.Scalar());
        out += ": ";
        append_yaml_as_json(out, kv.second);
      }
      out += '}';
      return;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() != "!") {  // "!" marks a quoted scalar: always a string
        if (s == "~" || s == "null" || s == "Null" || s == "NULL") { out += "null"; return; }
        if (s == "true" || s == "True" || s == "TRUE") { out += "true"; return; }
        if (s == "false" || s == "False" || s == "FALSE") { out += "false"; return; }
        std::int64_t i = 0;
        double d = 0;
        if (YAML::convert<std::int64_t>::decode(node, i)) { append_json_integer(out, i); return; }
        if (YAML::convert<double>::decode(node, d) && std::isfinite(d)) { append_json_number(out, d); return; }
      }
      append_json_string(out, s);
      return;
    }
  }
}

/// Reads a JSON file written by dettrial; a missing or unparsable file is an error naming it.
template <class ErrorT = Error>
YAML::Node load_json_file(const std::filesystem::path& path) {
  try {
    return YAML::LoadFile(path.string());
  } catch (const YAML::BadFile&) {
    throw ErrorT("cannot read '" + path.string() + "'");
  } catch (const YAML::Exception& e) {
    throw ErrorT("'" + path.string() + "' is not valid JSON (line " + std::to_string(e.mark.line + 1) + "): " + e.msg);
  }
}

}  // namespace dettrial::detail
