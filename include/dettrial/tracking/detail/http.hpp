// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief HTTP requests for tracking servers, through libcurl (TLS, proxies and redirects as curl
/// does them by default). Built only where libcurl was found (DETTRIAL_HAS_CURL); elsewhere a
/// request is an Error that says so.
#pragma once
// IWYU pragma: private, include <dettrial/dettrial.hpp>

#include <string>
#include <string_view>
#include <utility>

#include "../../error.hpp"
#include "../../detail/linkage.hpp"

namespace dettrial::detail {

/// What a server answered: its HTTP status and body.
struct HttpResponse {
  long status = 0;
  std::string body;
  bool ok() const { return status >= 200 && status < 300; }
};

/// A request that got no answer (no connection, a timeout, a TLS failure): curl's words.
struct HttpUnreachable : Error {
  using Error::Error;
};

/// How requests authenticate: a bearer token, else a username and password (basic), else none.
struct HttpAuth {
  std::string token, username, password;
};

/**
 * @brief One connection's worth of requests (curl keeps the connection alive between them). Not
 * shared between threads: each thread that talks to a server holds its own.
 */
class HttpClient {
 public:
  /// `timeout_seconds` bounds a whole request, connecting included.
  explicit HttpClient(HttpAuth auth = {}, long timeout_seconds = 30);
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  ~HttpClient();

  /// `method` (GET, POST, PUT) of `url` with `body` of `content_type`. Throws HttpUnreachable when
  /// no answer came; any answer (404, 500) is returned.
  HttpResponse request(std::string_view method, const std::string& url, std::string_view body = {},
                       std::string_view content_type = "application/json");

  /// `text` with every character a URL's query must not hold percent-encoded.
  static std::string escape(std::string_view text);

 private:
  HttpAuth auth_;
  long timeout_ = 30;
  void* curl_ = nullptr;
};

/// Whether this dettrial was built with libcurl.
constexpr bool http_available() {
#if DETTRIAL_HAS_CURL
  return true;
#else
  return false;
#endif
}

}  // namespace dettrial::detail

// Definitions: inline header-only, compiled once by <dettrial/src.hpp> in separate-compilation mode.
#if DETTRIAL_HEADER_DEFINITIONS
#include <cstdio>
#include <mutex>
#if DETTRIAL_HAS_CURL
#include <curl/curl.h>
#endif

namespace dettrial::detail {

#if DETTRIAL_HAS_CURL
}  // namespace dettrial::detail

namespace dettrial::detail::http {
inline std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}
}  // namespace dettrial::detail::http

namespace dettrial::detail {
DETTRIAL_INLINE HttpClient::HttpClient(HttpAuth auth, long timeout_seconds) : auth_(std::move(auth)), timeout_(timeout_seconds) {
  static std::once_flag initialized;
  std::call_once(initialized, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (!curl_) throw Error("libcurl could not start a session");
}

DETTRIAL_INLINE HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

DETTRIAL_INLINE HttpResponse HttpClient::request(std::string_view method, const std::string& url, std::string_view body,
                                                 std::string_view content_type) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);
  HttpResponse response;
  char error[CURL_ERROR_SIZE] = {};
  const std::string verb(method), header = "Content-Type: " + std::string(content_type);
  curl_slist* headers = curl_slist_append(nullptr, header.c_str());
  if (!auth_.token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + auth_.token).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, verb.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, timeout_);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, timeout_ < 10 ? timeout_ : 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // a training process's signals are its own
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &detail::http::append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  if (auth_.token.empty() && !auth_.username.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERNAME, auth_.username.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, auth_.password.c_str());
  }
  if (verb != "GET") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (code != CURLE_OK)
    throw HttpUnreachable(verb + " " + url + ": " + (error[0] ? std::string(error) : std::string(curl_easy_strerror(code))));
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}
#else
DETTRIAL_INLINE HttpClient::HttpClient(HttpAuth auth, long timeout_seconds) : auth_(std::move(auth)), timeout_(timeout_seconds) {}
DETTRIAL_INLINE HttpClient::~HttpClient() = default;
DETTRIAL_INLINE HttpResponse HttpClient::request(std::string_view method, const std::string& url, std::string_view, std::string_view) {
  throw HttpUnreachable(std::string(method) + " " + url + ": this dettrial was built without libcurl (Debian: libcurl4-openssl-dev)");
}
#endif

DETTRIAL_INLINE std::string HttpClient::escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", u);
      out += hex;
    }
  }
  return out;
}

}  // namespace dettrial::detail

#endif  // DETTRIAL_HEADER_DEFINITIONS
