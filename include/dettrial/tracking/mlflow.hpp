// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A run tracked in an MLflow server over its REST API (no Python in the training process):
/// its params, metrics, tags, artifacts and status, sent by a background thread so that a slow or
/// dead server never slows training. What the server does not take is kept in the run folder
/// (`mlflow-pending.jsonl`) and sent later: when it answers again, or by `--sync-mlflow DIR`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../detail/folder_lock.hpp"
#include "../detail/json_fwd.hpp"
#include "../layout.hpp"
#include "detail/http.hpp"
#include "../config/tracking.hpp"
#include "../detail/linkage.hpp"

namespace dettrial {

/// The MLflow server refused a request: the message names the request and says the server's reason.
struct MlflowError : Error {
  MlflowError(const std::string& what, long status) : Error(what), status(status) {}
  long status = 0;
};

}  // namespace dettrial

namespace dettrial::layout {
/// A tracked run's MLflow ids (server, experiment, run) and how far its metrics were sent.
inline constexpr const char* mlflow_state = "mlflow.json";
/// The MLflow requests the server did not take yet, one JSON object a line, in order.
inline constexpr const char* mlflow_pending = "mlflow-pending.jsonl";
}  // namespace dettrial::layout

namespace dettrial::detail {

/// MLflow's REST API, one request at a time (the calling thread waits).
class MlflowClient {
 public:
  MlflowClient(std::string tracking_uri, long timeout_seconds = 10);
  /// `POST /api/2.0/mlflow/<api>` (`GET` with `body`'s members as the query). Throws MlflowError
  /// for an answer that is not a success, HttpUnreachable for none.
  Json call(std::string_view method, std::string_view api, const Json& body);
  /// The id of experiment `name`, created if there is none.
  std::string experiment_id(const std::string& name);
  /// Uploads `bytes` as artifact `name` of a run whose artifact URI is `artifact_uri` (the server's
  /// artifact proxy, `mlflow-artifacts:/...`). Throws MlflowError for a URI the proxy does not serve.
  void upload_artifact(const std::string& artifact_uri, const std::string& name, std::string_view bytes);
  /// The tracking server's address, as given.
  const std::string& uri() const { return uri_; }

 private:
  std::string uri_;
  HttpClient http_;
};

/// What a run (or a search) is tracked with: `settings` completed from MLflow's environment
/// variables, the experiment "Default" and the run `default_run_name` where unnamed; nullopt when
/// no server is named, or this dettrial has no libcurl (said in a warning).
DETTRIAL_INLINE std::optional<MlflowSettings> tracked_settings(MlflowSettings settings, const std::string& default_run_name);

/// The HTTP auth MLflow's clients use: MLFLOW_TRACKING_TOKEN, else MLFLOW_TRACKING_USERNAME and _PASSWORD.
DETTRIAL_INLINE HttpAuth mlflow_auth();

/// Whether a failed request may succeed when sent again (no answer, 429 or 5xx), rather than being
/// refused for what it says.
DETTRIAL_INLINE bool retryable(const std::exception& e);

/// The requests kept in mlflow-pending.jsonl (read from `in`, named `name` in errors, or from the file at `path`, none when
/// there is none), in order: a torn last line was never acknowledged, and a record without its api is none dettrial wrote
/// (both left out); a damaged line before the last is an Error naming it.
DETTRIAL_INLINE std::vector<Json> read_mlflow_pending(std::istream& in, const std::string& name);
DETTRIAL_INLINE std::vector<Json> read_mlflow_pending(const std::filesystem::path& path);

/// Sends the pending requests of run folder `dir` (`--sync-mlflow`), creating its run first if the
/// server could not when it trained; keeps in the file those that still fail. Returns how many were
/// sent; throws what stopped it (the rest stays pending).
DETTRIAL_INLINE std::size_t sync_mlflow_run(const std::filesystem::path& dir);

/// `--sync-mlflow DIR`: sync_mlflow_run for a run's folder, or for a search's folder and each of its
/// trials' (each taken under its folder's lock: a live run sends its own). Returns each folder
/// tracked and how many requests it sent; throws when one could not be synced, or none was tracked.
DETTRIAL_INLINE std::vector<std::pair<std::filesystem::path, std::size_t>> sync_mlflow_folder(const std::filesystem::path& dir);

/// How an MLflow run ended (MLflow's RunStatus, less RUNNING and SCHEDULED, which a run starts in).
enum class MlflowEnd {
  finished,  ///< FINISHED: trained to its length (or the searcher stopped it)
  failed,    ///< FAILED: an error ended it (the default when end() was not called)
  killed,    ///< KILLED: a signal stopped it
};
/// MLflow's name of it: "FINISHED", "FAILED", "KILLED".
constexpr const char* mlflow_status_name(MlflowEnd end) {
  switch (end) {
    case MlflowEnd::finished: return "FINISHED";
    case MlflowEnd::killed: return "KILLED";
    case MlflowEnd::failed: break;
  }
  return "FAILED";
}

/**
 * @brief What a tracked run's folder keeps of its MLflow run (`mlflow.json`): the server, what
 * creates the run (kept, since the server may not take it until later), the ids the server gave,
 * and how far each kind of report was sent, so that a resumed run continues the same MLflow run
 * without sending a report twice.
 */
struct MlflowState {
  std::string tracking_uri;
  /// What creates the run (MLflow's `runs/create`, the experiment named rather than its id, which
  /// is looked up when the run is created). Tags are as MLflow takes them (keys cleaned, values cut).
  std::string experiment_name;
  std::string run_name;
  std::int64_t start_time_ms = 0;
  std::vector<std::pair<std::string, std::string>> tags;
  /// Filled in once the server created the run.
  std::string experiment_id;
  std::string run_id;
  std::string artifact_uri;
  /// The step of the last report of each kind (training, validation) sent or kept to send.
  std::map<std::string, std::int64_t, std::less<>> sent;

  /// Whether this state continues a run on server `tracking_uri` (one was started there).
  bool continues(std::string_view uri) const { return tracking_uri == uri && !experiment_name.empty(); }
  /// The folder's state; an empty one (tracked by nothing) when `dir` has no readable `mlflow.json`.
  static MlflowState read(const std::filesystem::path& dir);
  /// Writes `dir`'s `mlflow.json` atomically (throws Error naming the file where it cannot).
  void write(const std::filesystem::path& dir) const;
  /// The file's text, and the state from it (what is missing or of another type is left empty).
  std::string to_json() const;
  static MlflowState from_json(std::string_view text);
};

/**
 * @brief One run's MLflow run (on the chief). A resumed run continues the MLflow run whose id its
 * folder keeps, and does not log the reports it redoes a second time. Everything is queued here and
 * sent by a thread: requests that fail are retried a few times, then kept in the folder's pending
 * file, which is tried again every 30 s and at the end (one warning says so). end() sends the
 * status and waits for the queue, never longer than the server's timeouts.
 */
class MlflowRun {
 public:
  /// What the run starts with: its params (the hyperparameters, nested names dotted) and tags.
  struct Start {
    std::vector<std::pair<std::string, std::string>> params;
    std::vector<std::pair<std::string, std::string>> tags;
  };
  MlflowRun(MlflowSettings settings, std::filesystem::path dir, Start start);
  MlflowRun(const MlflowRun&) = delete;
  MlflowRun& operator=(const MlflowRun&) = delete;
  /// Ends as FAILED if end() was not called (the fit threw).
  ~MlflowRun();

  /// Metrics of a report of `kind` (training, validation) at batch `step`, unless a run before a
  /// resume sent that report already.
  /// `tags` go with them (the latest learning rates, a checkpoint's uuid).
  void log_metrics(std::string_view kind, std::int64_t step, const std::vector<std::pair<std::string, double>>& metrics,
                   const std::vector<std::pair<std::string, std::string>>& tags = {});
  /// The run's status and end time; waits for the queue to empty.
  void end(MlflowEnd status);
  /// The run's id in MLflow, once the thread has created (or continued) it; empty when the server
  /// did not answer (a search's runner hands it to its trials as their parent).
  std::string run_id();

 private:
  /// The queue, the thread that sends it and the run's state file (defined with the definitions,
  /// so that a trial's translation unit does not parse nlohmann/json for it).
  class Sender;
  std::unique_ptr<Sender> sender_;
};

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <initializer_list>
#include <istream>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include "../detail/atomic_file.hpp"
#include "../detail/json.hpp"
#include "../detail/jsonl.hpp"

namespace dettrial::detail::mlflow {
inline std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
/// `name` as MLflow takes a key: letters, digits and `_ - . : /` and spaces; anything else becomes `_`
/// (a metric named `acc@1` is logged as `acc_1`, not refused with its whole report).
inline std::string key_of(std::string_view name) {
  std::string key(name);
  for (char& c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '_' && c != '-' && c != '.' && c != ' ' && c != '/' && c != ':') c = '_';
  }
  return key;
}
/// Key-value pairs as MLflow's params and tags; values cut to what MLflow stores (6,000 characters
/// for a param, 8,000 for a tag: 6,000 for both).
inline Json key_values(const std::vector<std::pair<std::string, std::string>>& pairs, std::size_t from, std::size_t to) {
  Json out = Json::array();
  for (std::size_t i = from; i < to && i < pairs.size(); ++i)
    out.push_back({{"key", key_of(pairs[i].first)}, {"value", pairs[i].second.substr(0, 6000)}});
  return out;
}
/// The run's id in `body` (requests are queued without it: it may not be known yet).
inline void set_run(Json& body, const std::string& run_id) {
  if (body.is_object() && !body.contains("run_id")) body["run_id"] = run_id;
}
/// A string member of `j`, or empty.
inline std::string text_of(const Json& j, const char* key) {
  const auto found = j.find(key);
  return found != j.end() && found->is_string() ? found->get<std::string>() : std::string();
}
/// What a server's answer body begins with, for messages (300 bytes).
inline std::string excerpt(std::string_view body) { return std::string(body.substr(0, 300)); }
/// MLflow's answer to `api` from the server at `uri`: its JSON (an empty object for a body that is
/// none), or an MlflowError with the server's message when it is not a success.
inline Json answer_of(const HttpResponse& answer, const std::string& uri, std::string_view api) {
  Json parsed = Json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
  if (!answer.ok()) {
    std::string reason = text_of(parsed, "message");
    if (reason.empty()) reason = excerpt(answer.body);
    throw MlflowError(
        "the MLflow server at " + uri + " answered " + std::to_string(answer.status) + " to " + std::string(api) + ": " + reason,
        answer.status);
  }
  return parsed.is_discarded() ? Json::object() : parsed;
}
/// The string at `path` (member names, outermost first) in `answer`, the server's reply to `api`;
/// an MlflowError naming what the reply lacks otherwise (a server that is not MLflow, or another version).
inline std::string answer_text(const Json& answer, std::initializer_list<const char*> path, const std::string& uri, std::string_view api) {
  const Json* at = &answer;
  std::string dotted;
  for (const char* key : path) {
    dotted += (dotted.empty() ? "" : ".") + std::string(key);
    at = at ? json_find(*at, key) : nullptr;
  }
  if (!at || !at->is_string())
    throw MlflowError("the MLflow server at " + uri + " answered " + std::string(api) + " without a string " + dotted + ": " +
                          excerpt(answer.dump(-1, ' ', false, Json::error_handler_t::replace)),
                      0);
  return at->get<std::string>();
}
/// The run's id and artifact URI in `answer`, the reply to runs/create of the server at `uri`.
inline void read_created_run(const Json& answer, const std::string& uri, MlflowState& state) {
  state.run_id = answer_text(answer, {"run", "info", "run_id"}, uri, "runs/create");
  state.artifact_uri = text_of(answer.at("run").at("info"), "artifact_uri");
}
/// Creates the run the state describes, filling in its ids.
inline void create_run(MlflowClient& client, MlflowState& state) {
  state.experiment_id = client.experiment_id(state.experiment_name);
  const Json create = {{"experiment_id", state.experiment_id},
                       {"run_name", state.run_name},
                       {"start_time", state.start_time_ms},
                       {"tags", key_values(state.tags, 0, state.tags.size())}};
  read_created_run(client.call("POST", "runs/create", create), client.uri(), state);
}
/// Sends one kept or queued request whose run exists.
inline void send(MlflowClient& client, const MlflowState& state, const std::string& api, Json body) {
  if (api == "artifact") {
    client.upload_artifact(state.artifact_uri, text_of(body, "name"), text_of(body, "text"));
    return;
  }
  set_run(body, state.run_id);
  client.call("POST", api, body);
}
}  // namespace dettrial::detail::mlflow

namespace dettrial::detail {
DETTRIAL_INLINE MlflowState MlflowState::from_json(std::string_view text) {
  using detail::mlflow::text_of;
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  MlflowState s;
  if (!j.is_object()) return s;
  s.tracking_uri = text_of(j, "tracking_uri");
  s.experiment_id = text_of(j, "experiment_id");
  s.run_id = text_of(j, "run_id");
  s.artifact_uri = text_of(j, "artifact_uri");
  if (const auto create = j.find("create"); create != j.end() && create->is_object()) {
    s.experiment_name = text_of(*create, "experiment_name");
    s.run_name = text_of(*create, "run_name");
    if (const auto start = create->find("start_time"); start != create->end() && start->is_number_integer())
      s.start_time_ms = start->get<std::int64_t>();
    if (const auto tags = create->find("tags"); tags != create->end() && tags->is_array())
      for (const Json& tag : *tags)
        if (tag.is_object()) s.tags.emplace_back(text_of(tag, "key"), text_of(tag, "value"));
  }
  if (const auto sent = j.find("sent"); sent != j.end() && sent->is_object())
    for (const auto& [kind, step] : sent->items())
      if (step.is_number_integer()) s.sent[kind] = step.get<std::int64_t>();
  return s;
}

DETTRIAL_INLINE std::string MlflowState::to_json() const {
  Json sent_steps = Json::object();
  for (const auto& [kind, step] : sent) sent_steps[kind] = step;
  Json j = {{"tracking_uri", tracking_uri},
            {"run_id", run_id},
            {"create",
             {{"experiment_name", experiment_name},
              {"run_name", run_name},
              {"start_time", start_time_ms},
              {"tags", detail::mlflow::key_values(tags, 0, tags.size())}}},
            {"sent", std::move(sent_steps)}};
  if (!experiment_id.empty()) j["experiment_id"] = experiment_id;
  if (!run_id.empty()) j["artifact_uri"] = artifact_uri;
  return json_text(j);
}

DETTRIAL_INLINE MlflowState MlflowState::read(const std::filesystem::path& dir) {
  std::ifstream in(dir / layout::mlflow_state);
  if (!in) return {};
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return from_json(text);
}

DETTRIAL_INLINE void MlflowState::write(const std::filesystem::path& dir) const { write_atomically(dir / layout::mlflow_state, to_json()); }

DETTRIAL_INLINE HttpAuth mlflow_auth() {
  return {environment_value("MLFLOW_TRACKING_TOKEN"), environment_value("MLFLOW_TRACKING_USERNAME"),
          environment_value("MLFLOW_TRACKING_PASSWORD")};
}

DETTRIAL_INLINE std::optional<MlflowSettings> tracked_settings(MlflowSettings settings, const std::string& default_run_name) {
  settings.complete_from_environment();
  if (!settings.enabled()) return std::nullopt;
  if (!http_available()) {
    std::fprintf(stderr, "dettrial: warning: MLflow tracking at %s is off: this dettrial was built without libcurl\n",
                 settings.tracking_uri.c_str());
    return std::nullopt;
  }
  if (settings.experiment_name.empty()) settings.experiment_name = "Default";
  if (settings.run_name.empty()) settings.run_name = default_run_name;
  return settings;
}

DETTRIAL_INLINE bool retryable(const std::exception& e) {
  if (dynamic_cast<const HttpUnreachable*>(&e)) return true;
  if (const auto* refused = dynamic_cast<const MlflowError*>(&e)) return refused->status == 429 || refused->status >= 500;
  return false;
}

DETTRIAL_INLINE MlflowClient::MlflowClient(std::string tracking_uri, long timeout_seconds)
    : uri_(std::move(tracking_uri)), http_(mlflow_auth(), timeout_seconds) {}

DETTRIAL_INLINE Json MlflowClient::call(std::string_view method, std::string_view api, const Json& body) {
  std::string url = uri_ + "/api/2.0/mlflow/" + std::string(api);
  HttpResponse answer;
  if (method == "GET") {
    char separator = '?';
    for (const auto& [key, value] : body.items()) {
      url += separator + key + "=" + HttpClient::escape(value.is_string() ? value.get<std::string>() : value.dump());
      separator = '&';
    }
    answer = http_.request("GET", url);
  } else {
    answer = http_.request(method, url, body.dump());
  }
  return detail::mlflow::answer_of(answer, uri_, api);
}

DETTRIAL_INLINE std::string MlflowClient::experiment_id(const std::string& name) {
  const auto by_name = [&] {
    return detail::mlflow::answer_text(call("GET", "experiments/get-by-name", {{"experiment_name", name}}), {"experiment", "experiment_id"},
                                       uri_, "experiments/get-by-name");
  };
  try {
    return by_name();
  } catch (const MlflowError& e) {
    if (e.status != 404) throw;
  }
  try {
    return detail::mlflow::answer_text(call("POST", "experiments/create", {{"name", name}}), {"experiment_id"}, uri_, "experiments/create");
  } catch (const MlflowError& e) {
    // Another process (a search's trial) created it meanwhile.
    if (e.status != 400 && e.status != 409) throw;
    return by_name();
  }
}

DETTRIAL_INLINE void MlflowClient::upload_artifact(const std::string& artifact_uri, const std::string& name, std::string_view bytes) {
  constexpr std::string_view proxied = "mlflow-artifacts:";
  if (artifact_uri.rfind(proxied, 0) != 0)
    throw MlflowError("the MLflow server at " + uri_ + " keeps this run's artifacts at '" + artifact_uri +
                          "', which dettrial cannot write over HTTP (start the server with --serve-artifacts)",
                      0);
  std::string path = artifact_uri.substr(proxied.size());
  while (!path.empty() && path.front() == '/') path.erase(0, 1);
  const std::string url = uri_ + "/api/2.0/mlflow-artifacts/artifacts/" + path + "/" + name;
  const HttpResponse answer = http_.request("PUT", url, bytes, "application/octet-stream");
  if (!answer.ok())
    throw MlflowError("the MLflow server at " + uri_ + " answered " + std::to_string(answer.status) + " to the upload of artifact '" +
                          name + "': " + answer.body.substr(0, 300),
                      answer.status);
}

DETTRIAL_INLINE std::vector<Json> read_mlflow_pending(std::istream& in, const std::string& name) {
  std::vector<Json> pending;
  for (Json& entry : JsonlFile::read(in, name))
    if (!mlflow::text_of(entry, "api").empty()) pending.push_back(std::move(entry));
  return pending;
}

DETTRIAL_INLINE std::vector<Json> read_mlflow_pending(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return read_mlflow_pending(in, path.string());
}

DETTRIAL_INLINE std::size_t sync_mlflow_run(const std::filesystem::path& dir) {
  MlflowState state = MlflowState::read(dir);
  if (state.tracking_uri.empty())
    throw Error("'" + (dir / layout::mlflow_state).string() + "' is missing: the run in '" + dir.string() + "' was not tracked in MLflow");
  const std::filesystem::path pending_path = dir / layout::mlflow_pending;
  std::vector<Json> pending = read_mlflow_pending(pending_path);
  if (pending.empty() && !state.run_id.empty()) return 0;
  MlflowClient client(state.tracking_uri);
  if (state.run_id.empty()) {
    detail::mlflow::create_run(client, state);
    state.write(dir);
  }
  std::size_t sent = 0;
  try {
    for (; sent < pending.size(); ++sent)
      detail::mlflow::send(client, state, detail::mlflow::text_of(pending[sent], "api"), pending[sent].value("body", Json::object()));
  } catch (...) {
    std::string rest;
    for (std::size_t i = sent; i < pending.size(); ++i) rest += json_line(pending[i]);
    write_atomically(pending_path, rest);
    throw;
  }
  std::error_code ignored;
  std::filesystem::remove(pending_path, ignored);
  return sent;
}

DETTRIAL_INLINE std::vector<std::pair<std::filesystem::path, std::size_t>> sync_mlflow_folder(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> folders;
  if (std::filesystem::exists(dir / layout::mlflow_state)) folders.push_back(dir);
  std::error_code ec;
  std::vector<std::filesystem::path> trials;
  for (const auto& entry : std::filesystem::directory_iterator(ExperimentFolder{dir}.trials(), ec))
    if (std::filesystem::exists(entry.path() / layout::mlflow_state)) trials.push_back(entry.path());
  std::sort(trials.begin(), trials.end());
  folders.insert(folders.end(), trials.begin(), trials.end());
  if (folders.empty())
    throw Error("'" + dir.string() + "' holds no run tracked in MLflow (no " + layout::mlflow_state + " in it or its trials)");
  std::vector<std::pair<std::filesystem::path, std::size_t>> out;
  for (const std::filesystem::path& folder : folders) {
    const FolderLock lock = FolderLock::acquire(folder / layout::lock, "run folder");
    out.emplace_back(folder, sync_mlflow_run(folder));
  }
  return out;
}

/// MlflowRun's insides: everything is queued here and sent by the thread `worker_`.
class MlflowRun::Sender {
 public:
  Sender(MlflowSettings settings, std::filesystem::path dir, Start start);
  ~Sender();
  void log_metrics(std::string_view kind, std::int64_t step, const std::vector<std::pair<std::string, double>>& metrics,
                   const std::vector<std::pair<std::string, std::string>>& tags);
  void end(MlflowEnd status);
  std::string run_id();

 private:
  struct Request {
    std::string api;
    Json body;
    /// The report it carries (kind and step), if any: what the state file records as sent.
    std::string kind;
    std::int64_t step = -1;
  };
  void enqueue(Request request);
  void work();
  /// Sends `r` (its run id filled in), retrying what may succeed; false when it failed and was kept.
  bool deliver(Request& r);
  void keep_pending(const Request& r);
  void save_state();

  MlflowSettings settings_;
  std::filesystem::path dir_;
  MlflowClient client_;
  MlflowState state_;
  std::map<std::string, std::int64_t, std::less<>> sent_before_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Request> queue_;
  /// Requests queued and handled so far (run_id() waits for its own), and the run's id when known.
  std::size_t queued_ = 0, handled_ = 0;
  std::string run_id_;
  std::condition_variable handled_one_;
  bool closing_ = false, ended_ = false, warned_ = false;
  std::thread worker_;
};

DETTRIAL_INLINE MlflowRun::Sender::Sender(MlflowSettings settings, std::filesystem::path dir, Start start)
    : settings_(std::move(settings)), dir_(std::move(dir)), client_(settings_.tracking_uri) {
  state_ = MlflowState::read(dir_);
  const bool continued = state_.continues(settings_.tracking_uri);
  if (continued) {
    sent_before_ = state_.sent;
  } else {
    std::vector<std::pair<std::string, std::string>> tags = settings_.tags;
    tags.insert(tags.end(), start.tags.begin(), start.tags.end());
    if (!settings_.parent_run_id.empty()) tags.emplace_back("mlflow.parentRunId", settings_.parent_run_id);
    tags.emplace_back("mlflow.runName", settings_.run_name);
    state_ = MlflowState{};
    state_.tracking_uri = settings_.tracking_uri;
    state_.experiment_name = settings_.experiment_name;
    state_.run_name = settings_.run_name;
    state_.start_time_ms = detail::mlflow::now_ms();
    state_.tags = std::move(tags);
  }
  std::filesystem::create_directories(dir_);
  // A run killed while keeping a request tore its line: the next one kept must not join it.
  JsonlFile(dir_ / layout::mlflow_pending).cut_torn_line();
  save_state();
  worker_ = std::thread([this] { work(); });
  if (continued) {
    enqueue({"runs/update", {{"status", "RUNNING"}}, {}, -1});
    return;
  }
  // MLflow takes at most 100 params a request; a param's value is immutable (a resumed run sends none).
  for (std::size_t i = 0; i < start.params.size(); i += 100)
    enqueue({"runs/log-batch", {{"params", detail::mlflow::key_values(start.params, i, i + 100)}}, {}, -1});
  if (!settings_.config_text.empty()) enqueue({"artifact", {{"name", "config.yaml"}, {"text", settings_.config_text}}, {}, -1});
}

DETTRIAL_INLINE MlflowRun::Sender::~Sender() {
  if (!ended_) end(MlflowEnd::failed);
}

DETTRIAL_INLINE void MlflowRun::Sender::log_metrics(std::string_view kind, std::int64_t step,
                                                    const std::vector<std::pair<std::string, double>>& metrics,
                                                    const std::vector<std::pair<std::string, std::string>>& tags) {
  if (const auto before = sent_before_.find(kind); before != sent_before_.end() && step <= before->second) return;
  Json list = Json::array();
  const std::int64_t now = detail::mlflow::now_ms();
  for (const auto& [key, value] : metrics)  // JSON has no NaN nor infinity
    if (std::isfinite(value)) list.push_back({{"key", detail::mlflow::key_of(key)}, {"value", value}, {"timestamp", now}, {"step", step}});
  Json body = {{"metrics", std::move(list)}};
  if (!tags.empty()) body["tags"] = detail::mlflow::key_values(tags, 0, tags.size());
  enqueue({"runs/log-batch", std::move(body), std::string(kind), step});
}

DETTRIAL_INLINE void MlflowRun::Sender::end(MlflowEnd status) {
  if (ended_) return;
  ended_ = true;
  enqueue({"runs/update", {{"status", mlflow_status_name(status)}, {"end_time", detail::mlflow::now_ms()}}, {}, -1});
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

DETTRIAL_INLINE void MlflowRun::Sender::enqueue(Request request) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(request));
    ++queued_;
  }
  wake_.notify_all();
}

DETTRIAL_INLINE std::string MlflowRun::Sender::run_id() {
  enqueue({"", Json::object(), {}, -1});  // nothing to send: the run is created, if it is not yet
  std::unique_lock lock(mutex_);
  const std::size_t ticket = queued_;
  handled_one_.wait(lock, [&] { return handled_ >= ticket; });
  return run_id_;
}

DETTRIAL_INLINE void MlflowRun::Sender::work() {
  using Clock = std::chrono::steady_clock;
  auto next_retry = Clock::now();
  for (;;) {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, std::chrono::seconds(30), [&] { return closing_ || !queue_.empty(); });
    const bool closing = closing_;
    std::deque<Request> batch;
    batch.swap(queue_);
    lock.unlock();
    const bool kept = std::filesystem::exists(dir_ / layout::mlflow_pending);
    if (kept && (closing || Clock::now() >= next_retry)) {
      // The server failed before: what it did not take goes first, in order.
      try {
        sync_mlflow_run(dir_);
        state_ = MlflowState::read(dir_);
      } catch (const std::exception&) {
        next_retry = Clock::now() + std::chrono::seconds(30);
      }
    }
    for (Request& r : batch) {
      if (!std::filesystem::exists(dir_ / layout::mlflow_pending)) deliver(r);
      else if (!r.api.empty()) keep_pending(r);
      if (!r.kind.empty()) state_.sent[r.kind] = r.step;
    }
    if (!batch.empty()) save_state();
    {
      std::lock_guard done(mutex_);
      handled_ += batch.size();
      run_id_ = state_.run_id;
    }
    handled_one_.notify_all();
    if (closing) {
      if (std::filesystem::exists(dir_ / layout::mlflow_pending))
        std::fprintf(stderr, "dettrial: MLflow requests the server at %s did not take are kept in %s: send them with --sync-mlflow %s\n",
                     settings_.tracking_uri.c_str(), (dir_ / layout::mlflow_pending).c_str(), dir_.c_str());
      return;
    }
  }
}

DETTRIAL_INLINE bool MlflowRun::Sender::deliver(Request& r) {
  for (int attempt = 0;; ++attempt) {
    try {
      if (state_.run_id.empty()) {
        detail::mlflow::create_run(client_, state_);
        save_state();
      }
      if (!r.api.empty()) detail::mlflow::send(client_, state_, r.api, r.body);
      return true;
    } catch (const std::exception& e) {
      if (!retryable(e)) {
        // The server refuses what the request says: sending it again cannot help.
        std::fprintf(stderr, "dettrial: warning: MLflow: %s\n", e.what());
        return true;
      }
      if (attempt < 2) {
        std::this_thread::sleep_for(std::chrono::seconds(1 << attempt));
        continue;
      }
      if (!warned_)
        std::fprintf(stderr,
                     "dettrial: warning: the MLflow server does not answer (%s): training goes on, and what it does not take is kept "
                     "in %s and sent when it answers again (or by --sync-mlflow %s)\n",
                     e.what(), (dir_ / layout::mlflow_pending).c_str(), dir_.c_str());
      warned_ = true;
      if (!r.api.empty()) keep_pending(r);
      return false;
    }
  }
}

DETTRIAL_INLINE void MlflowRun::Sender::keep_pending(const Request& r) {
  try {
    JsonlFile(dir_ / layout::mlflow_pending).append(Json{{"api", r.api}, {"body", r.body}});
  } catch (const Error& e) {
    std::fprintf(stderr, "dettrial: warning: %s: an MLflow request is lost\n", e.what());
  }
}

DETTRIAL_INLINE void MlflowRun::Sender::save_state() {
  try {
    state_.write(dir_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dettrial: warning: %s\n", e.what());
  }
}

DETTRIAL_INLINE MlflowRun::MlflowRun(MlflowSettings settings, std::filesystem::path dir, Start start)
    : sender_(std::make_unique<Sender>(std::move(settings), std::move(dir), std::move(start))) {}

DETTRIAL_INLINE MlflowRun::~MlflowRun() = default;

DETTRIAL_INLINE void MlflowRun::log_metrics(std::string_view kind, std::int64_t step,
                                            const std::vector<std::pair<std::string, double>>& metrics,
                                            const std::vector<std::pair<std::string, std::string>>& tags) {
  sender_->log_metrics(kind, step, metrics, tags);
}

DETTRIAL_INLINE void MlflowRun::end(MlflowEnd status) { sender_->end(status); }

DETTRIAL_INLINE std::string MlflowRun::run_id() { return sender_->run_id(); }

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
