// Beast's message types as the server uses them: a request as read, and a
// response relayed from an upstream (wire.h writes what goes to a client).
// Header-only; Beast's message headers, no Asio.
#ifndef SLUICE_SERVER_HTTP_H_
#define SLUICE_SERVER_HTTP_H_

#include <string>
#include <string_view>
#include <utility>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/answer.h"
#include "server/http_request.h"

namespace sluice::server {

namespace http = boost::beast::http;
using Request = HttpRequest;
using Response = http::response<http::string_body>;

}  // namespace sluice::server

#endif  // SLUICE_SERVER_HTTP_H_
