// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An experiment's events.jsonl as the search runner writes and replays it: typed events,
/// read strictly, each error naming the file and the line.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>
// IWYU pragma: private, include <dettrial/search.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "../../detail/jsonl.hpp"
#include "../../vocabulary/search_event.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// An event of the log and its line's text, for messages.
struct LoggedEvent {
  SearchEvent event;
  std::string line;
};

/// events.jsonl: what the searcher was told, in order, so that a second runner replays it.
class EventLog {
 public:
  explicit EventLog(std::filesystem::path path) : file_(std::move(path)) {}
  const std::filesystem::path& path() const { return file_.path(); }

  void append(const SearchEvent& event) const;

  /// Cuts a torn last line (a runner killed while writing it) off, so that this runner's first
  /// event is not appended to it and lost with it; true when it cut one.
  bool cut_torn_line() const { return file_.cut_torn_line(); }

  /// The events, in order (none when there is no log). A torn last line is left out; a damaged line
  /// before it, or an event that lacks a field or has one of the wrong type, is an Error naming the
  /// file and quoting the line.
  std::vector<LoggedEvent> read() const;

 private:
  JsonlFile file_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include "../../error.hpp"
#include "../../detail/json.hpp"

namespace dettrial::detail {

DETTRIAL_INLINE void EventLog::append(const SearchEvent& event) const { file_.append(event.to_json()); }

DETTRIAL_INLINE std::vector<LoggedEvent> EventLog::read() const {
  std::vector<LoggedEvent> events;
  if (!std::filesystem::exists(path())) return events;
  for (const Json& j : file_.read()) {
    std::string line = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    try {
      events.push_back({SearchEvent::from_json(j), std::move(line)});
    } catch (const JsonFieldError& err) {
      throw Error("'" + path().string() + "' has an event that lacks a field or has one of the wrong type (" + err.what() + "): " + line);
    }
  }
  return events;
}

}  // namespace dettrial::detail
#endif  // DETTRIAL_HEADER_DEFINITIONS
