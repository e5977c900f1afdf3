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

// What makes a parsed request unfit to decide on (answered 400), if anything.
inline std::optional<std::string> Malformed(const BeastRequest& req) {
  namespace http = boost::beast::http;
  // One walk of the fields counts what the rules below read (a lookup per
  // name walks the field tree once each).
  int hosts = 0;
  TransferCodings codings;
  for (const auto& f : req) {
    if (f.name() == http::field::host) ++hosts;
    if (f.name() == http::field::transfer_encoding) codings.Add(f.value());
  }
  if (req.version() >= 11 && hosts == 0) {
    // RFC 9112 section 3.2: an HTTP/1.1 request without Host is answered 400.
    return "an HTTP/1.1 request needs a Host header";
  }
  if (hosts > 1) return "a request has one Host header, this one has several";
  if (codings.Other()) {
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

// The value of `message`'s first field named `name` (compared as field
// names are), or nullopt. A walk of the fields: for the few a request has,
// cheaper than Beast's lookup by name (the name hashed, then a walk of the
// field tree), and the same field (Beast keeps fields of one name in the
// order they came).
template <typename Message>
std::optional<std::string_view> FirstField(const Message& message, std::string_view name) {
  const boost::beast::string_view wanted(name.data(), name.size());
  for (const auto& f : message) {
    const boost::beast::string_view n = f.name_string();
    if (n.size() == wanted.size() && boost::beast::iequals(n, wanted)) return View(f.value());
  }
  return std::nullopt;
}

// The value of the request's first Host field (empty when none).
inline std::string_view HostField(const BeastRequest& req) {
  for (const auto& f : req) {
    if (f.name() == boost::beast::http::field::host) return View(f.value());
  }
  return {};
}

// The facts of a request for `method` and `target` (the request's own, or
// what X-Original-* describe), with `host_field` its Host field's value;
// `path_storage` and `host_storage` hold what they point into.
inline RequestFacts FactsOf(const BeastRequest& req, std::string_view peer_ip,
                            std::string_view method, std::string_view target,
                            std::string_view host_field, std::string& path_storage,
                            std::string& host_storage) {
  RequestFacts facts;
  facts.method = method;
  path_storage = NormalizePath(TargetPath(target));
  facts.path = path_storage;
  // An absolute-form target names the host itself, and the Host header is
  // then ignored (RFC 9112 section 3.2.2), as the upstream will.
  const std::optional<std::string_view> authority = TargetAuthority(target);
  host_storage = internal::AsciiLower(HostName(authority ? *authority : host_field));
  facts.host = host_storage;
  facts.peer_ip = peer_ip;
  facts.header = [&req](std::string_view name) { return FirstField(req, name); };
  facts.header_lines = [&req](std::string_view name) {
    std::vector<std::string_view> lines;
    const auto [begin, end] = req.equal_range(boost::beast::string_view(name.data(), name.size()));
    for (auto it = begin; it != end; ++it) lines.push_back(View(it->value()));
    return lines;
  };
  return facts;
}

// The same for the request's own method and target.
inline RequestFacts FactsOf(const BeastRequest& req, std::string_view peer_ip,
                            std::string_view method, std::string_view target,
                            std::string& path_storage, std::string& host_storage) {
  return FactsOf(req, peer_ip, method, target, HostField(req), path_storage, host_storage);
}

// The facts of the request an NGINX auth_request subrequest describes:
// X-Original-Method (default GET), X-Original-URI (default /) and
// X-Original-Host (default the Host rules above). The fields are read in
// one walk, the first of each name.
inline RequestFacts AuthFactsOf(const BeastRequest& req, std::string_view peer_ip,
                                std::string& path_storage, std::string& host_storage) {
  namespace http = boost::beast::http;
  std::optional<std::string_view> method, uri, original_host, host;
  const auto take = [](std::optional<std::string_view>& slot, const auto& f) {
    if (!slot) slot = View(f.value());
  };
  for (const auto& f : req) {
    if (f.name() == http::field::host) {
      take(host, f);
      continue;
    }
    const boost::beast::string_view n = f.name_string();
    if (n.size() < 14 || !boost::beast::iequals(n.substr(0, 11), "X-Original-")) continue;
    const boost::beast::string_view rest = n.substr(11);
    if (boost::beast::iequals(rest, "Method")) {
      take(method, f);
    } else if (boost::beast::iequals(rest, "URI")) {
      take(uri, f);
    } else if (boost::beast::iequals(rest, "Host")) {
      take(original_host, f);
    }
  }
  const std::string_view m = method && !method->empty() ? *method : std::string_view("GET");
  const std::string_view u = uri && !uri->empty() ? *uri : std::string_view("/");
  RequestFacts facts =
      FactsOf(req, peer_ip, m, u, host.value_or(std::string_view()), path_storage, host_storage);
  if (original_host && !original_host->empty()) {
    host_storage = internal::AsciiLower(HostName(*original_host));
    facts.host = host_storage;
  }
  return facts;
}
}  // namespace sluice::server

#endif  // SLUICE_SERVER_BEAST_REQUEST_H_
