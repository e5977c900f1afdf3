// HttpAnswer: what a handler answers, as a value: status, content type,
// body and extra header fields. The transport (server.cc) turns it into the
// HTTP response of the client's version and keep-alive; handlers never see
// a wire format, and an error document is built once, never re-read.
// Header-only, free of Beast and Asio.
#ifndef SLUICE_SERVER_ANSWER_H_
#define SLUICE_SERVER_ANSWER_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "policy/field_list.h"
#include "policy/headers.h"

namespace sluice::server {

using HeaderList = policy::FieldList;

struct HttpAnswer {
  int status = 200;
  // A text of the program's own (a literal, an embedded asset's type);
  // empty: no Content-Type (a 204).
  std::string_view content_type;
  std::string body;
  HeaderList headers;

  // An RFC 9457 problem document (bad request, unknown policy, ...).
  static HttpAnswer Problem(int status, std::string_view title, std::string_view detail) {
    return {status, "application/problem+json", policy::ErrorBody(status, title, detail), {}};
  }
  static HttpAnswer Json(int status, std::string body, HeaderList headers = {}) {
    return {status, "application/json", std::move(body), std::move(headers)};
  }
  static HttpAnswer Text(int status, std::string body) {
    return {status, "text/plain", std::move(body), {}};
  }
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_ANSWER_H_
