// Beast's message types as the server uses them, and the one place a
// response is made: from a handler's HttpAnswer, or from parts. Header-only;
// Beast's message headers, no Asio.
#ifndef SLUICE_SERVER_HTTP_H_
#define SLUICE_SERVER_HTTP_H_

#include <string>
#include <string_view>
#include <utility>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/answer.h"
#include "server/beast_request.h"

namespace sluice::server {

namespace http = boost::beast::http;
using Request = BeastRequest;
using Response = http::response<http::string_body>;

inline Response MakeResponse(int status, unsigned version, bool keep_alive, std::string body,
                             std::string_view content_type, const HeaderList& headers = {}) {
  Response res{static_cast<http::status>(status), version};
  res.set(http::field::server, "sluice");
  if (!body.empty() || status != 204) {
    res.set(http::field::content_type,
            boost::beast::string_view(content_type.data(), content_type.size()));
  }
  for (const auto& [name, value] : headers) res.set(name, value);
  res.body() = std::move(body);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

// `answer` as the response to `req` (its version and keep-alive).
inline Response ToResponse(HttpAnswer answer, const Request& req) {
  return MakeResponse(answer.status, req.version(), req.keep_alive(), std::move(answer.body),
                      answer.content_type, answer.headers);
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_HTTP_H_
