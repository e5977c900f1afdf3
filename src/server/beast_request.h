// Reading a parsed Beast request: whether it is fit to decide on, and the
// RequestFacts matching and keys read. Internal to the server; server.cc
// serves with these and the HTTP fuzz target (fuzz/http_request.cc) checks
// them, so both read a request the same way. Header-only and free of Asio,
// so that it compiles wherever Beast's message types do.
//
// Thread-safety: pure functions; the facts point into the request.
#ifndef SLUICE_SERVER_BEAST_REQUEST_H_
#define SLUICE_SERVER_BEAST_REQUEST_H_

#include <algorithm>
#include <cctype>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/ascii.h"
#include "base/cat.h"
#include "policy/policy_set.h"
#include "policy/request_text.h"

namespace sluice::server {

using policy::HostName;
using policy::NormalizePath;
using policy::RequestFacts;
using policy::TargetAuthority;
using policy::TargetPath;

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;

inline std::string_view View(boost::beast::string_view s) { return {s.data(), s.size()}; }

// The transfer codings of Transfer-Encoding fields, counted one field value
// at a time: whether they are chunked alone.
struct TransferCodings {
  int fields = 0;
  int count = 0;
  bool chunked_last = false;

  void Add(boost::beast::string_view field_value) {
    ++fields;
    for (const auto token : boost::beast::http::token_list{field_value}) {
      ++count;
      chunked_last = boost::beast::iequals(token, "chunked");
    }
  }
  // A field there, and not chunked alone: a coding Beast does not undo
  // (gzip, ...), or none that frames the body (an empty field too).
  bool Other() const { return fields > 0 && (count != 1 || !chunked_last); }
};

// Whether `message` has a Transfer-Encoding other than chunked alone.
template <typename Message>
bool HasOtherTransferCoding(const Message& message) {
  const auto [begin, end] = message.equal_range(boost::beast::http::field::transfer_encoding);
  TransferCodings codings;
  for (auto it = begin; it != end; ++it) codings.Add(it->value());
  return codings.Other();
}

// What makes a parsed request unfit to decide on (answered 400), if anything.
inline std::optional<std::string> Malformed(const BeastRequest& req) {
  namespace http = boost::beast::http;
  const auto [host_begin, host_end] = req.equal_range(http::field::host);
  const auto hosts = std::distance(host_begin, host_end);
  if (req.version() >= 11 && hosts == 0) {
    // RFC 9112 section 3.2: an HTTP/1.1 request without Host is answered 400.
    return "an HTTP/1.1 request needs a Host header";
  }
  if (hosts > 1) return "a request has one Host header, this one has several";
  if (HasOtherTransferCoding(req)) {
    // RFC 9112 section 6.3: a request whose last transfer coding is not
    // chunked has no length to read it by (Beast reads it as having no
    // body, and what follows as the next request); a coding before chunked
    // (gzip, ...) is one sluice does not undo, whose body would go upstream
    // still coded, without the field that says so.
    return "a request's Transfer-Encoding may only be chunked";
  }
  if (req.method() == http::verb::trace && !req.body().empty()) {
    // RFC 9110 section 9.3.8; Beast's prepare_payload throws on one, so the
    // gateway could not forward it.
    return "a TRACE request carries no content";
  }
  const std::string_view target = View(req.target());
  if (target.empty() || (target.front() != '/' && !TargetAuthority(target))) {
    return internal::Cat(
        "the request target must be a path (origin form) or an http:// or https:// URL "
        "(absolute form), got \"",
        target.substr(0, 64), "\"");
  }
  return std::nullopt;
}

// The facts of a request for `method` and `target` (the request's own, or
// what X-Original-* describe); `path_storage` and `host_storage` hold what
// they point into.
inline RequestFacts FactsOf(const BeastRequest& req, std::string_view peer_ip,
                            std::string_view method, std::string_view target,
                            std::string& path_storage, std::string& host_storage) {
  namespace http = boost::beast::http;
  RequestFacts facts;
  facts.method = method;
  path_storage = NormalizePath(TargetPath(target));
  facts.path = path_storage;
  // An absolute-form target names the host itself, and the Host header is
  // then ignored (RFC 9112 section 3.2.2), as the upstream will.
  const std::optional<std::string_view> authority = TargetAuthority(target);
  host_storage =
      internal::AsciiLower(HostName(authority ? *authority : View(req[http::field::host])));
  facts.host = host_storage;
  facts.peer_ip = peer_ip;
  facts.header = [&req](std::string_view name) -> std::optional<std::string_view> {
    auto it = req.find(boost::beast::string_view(name.data(), name.size()));
    if (it == req.end()) return std::nullopt;
    return View(it->value());
  };
  facts.header_lines = [&req](std::string_view name) {
    std::vector<std::string_view> lines;
    const auto [begin, end] = req.equal_range(boost::beast::string_view(name.data(), name.size()));
    for (auto it = begin; it != end; ++it) lines.push_back(View(it->value()));
    return lines;
  };
  return facts;
}

// The facts of the request an NGINX auth_request subrequest describes:
// X-Original-Method (default GET), X-Original-URI (default /) and
// X-Original-Host (default the Host rules above).
inline RequestFacts AuthFactsOf(const BeastRequest& req, std::string_view peer_ip,
                                std::string& path_storage, std::string& host_storage) {
  std::string_view method = View(req["X-Original-Method"]);
  if (method.empty()) method = "GET";
  std::string_view uri = View(req["X-Original-URI"]);
  if (uri.empty()) uri = "/";
  RequestFacts facts = FactsOf(req, peer_ip, method, uri, path_storage, host_storage);
  if (std::string_view original_host = View(req["X-Original-Host"]); !original_host.empty()) {
    host_storage = internal::AsciiLower(HostName(original_host));
    facts.host = host_storage;
  }
  return facts;
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_BEAST_REQUEST_H_
