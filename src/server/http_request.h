// A request as a client sent it, and reading it: HttpRequest (its line,
// its fields as they came, its body), RequestParser (Beast's basic_parser
// filling one: Beast reads the request line, the fields, the framing,
// chunked bodies and the limits), whether a request is fit to decide on,
// and the RequestFacts matching and keys read. Internal to the server;
// server.cc serves with these and the HTTP fuzz target
// (fuzz/http_request.cc) checks them, so both read a request the same way.
// Header-only and free of Asio.
//
// Its fields are not Beast's field table (basic_fields: a node allocated
// and placed in a tree for each field, found again by name): a request
// reads them once or twice, in a walk (ParsedFields).
//
// Thread-safety: a value type and pure functions; the facts point into the
// request.
#ifndef SLUICE_SERVER_HTTP_REQUEST_H_
#define SLUICE_SERVER_HTTP_REQUEST_H_

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/verb.hpp>

#include "base/ascii.h"
#include "base/cat.h"
#include "policy/policy_set.h"
#include "policy/request_text.h"
#include "server/parsed_fields.h"

namespace sluice::server {

using policy::HostName;
using policy::NormalizePath;
using policy::RequestFacts;
using policy::TargetAuthority;
using policy::TargetPath;
using policy::TargetQuery;

class HttpRequest : public ParsedFields {
 public:
  boost::beast::http::verb method() const { return method_; }
  // As it came (a method Beast knows is its name: the parser matches names
  // exactly).
  std::string_view method_string() const { return method_text_; }
  std::string_view target() const { return target_; }
  void target(std::string t) { target_ = std::move(t); }
  unsigned version() const { return version_; }
  void version(unsigned v) { version_ = v; }
  std::string& body() { return body_; }
  const std::string& body() const { return body_; }

  // Whether the connection persists after the answer, as the request's
  // Connection fields and version say (RFC 9112 section 9.3): not when any
  // of its Connection fields lists "close"; else, in HTTP/1.1, yes, and in
  // HTTP/1.0 only when one lists "keep-alive". Every Connection field
  // counts (Beast's message::keep_alive() reads only the first).
  bool keep_alive() const {
    bool close = false, alive = false;
    for (const Field& f : fields) {
      if (f.name != boost::beast::http::field::connection) continue;
      for (const auto token : boost::beast::http::token_list{
               boost::beast::string_view(Value(f).data(), Value(f).size())}) {
        if (boost::beast::iequals(token, "close")) close = true;
        if (boost::beast::iequals(token, "keep-alive")) alive = true;
      }
    }
    return !close && (version_ >= 11 || alive);
  }

  // The value of the first field named `name`, of those kept, or empty
  // (Beast's operator[]).
  std::string_view operator[](boost::beast::http::field name) const {
    return Find(name).value_or(std::string_view());
  }

  // Sets a field for the next hop: those of its name the client sent are
  // no longer kept, and `name: value` goes after every field kept. A name
  // is set once. `value` holds no CR, LF or NUL (what sluice writes, or what
  // the parser read).
  void Set(std::string_view name, std::string_view value) {
    Drop(name);
    AppendField(name, value, added_);
  }
  // Sets the one Content-Length for the next hop, as Set does.
  void SetLength(size_t length) {
    Drop(boost::beast::http::field::content_length);
    AppendLength(length, added_);
  }

  // Appends the request's head as it is now (its method, target, version,
  // the fields kept, then those set, and the blank line), for the gateway's
  // upstream, and returns its body.
  std::string_view AppendHead(std::string& out) const {
    out += method_text_;
    out += ' ';
    out += target_;
    out += version_ == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
    AppendKept(out);
    out += added_;
    out += "\r\n";
    return body_;
  }

 private:
  friend class RequestParser;

  boost::beast::http::verb method_ = boost::beast::http::verb::unknown;
  std::string method_text_;
  std::string target_;
  unsigned version_ = 11;
  std::string body_;
  std::string added_;
};

// Reads one request into an HttpRequest, as Beast's request_parser with a
// string_body reads one into a message (the limits, the framing and the
// chunked coding are basic_parser's).
class RequestParser final : public WholeMessageParser<true, RequestParser> {
 public:
  HttpRequest& get() { return request_; }
  HttpRequest release() { return std::move(request_); }

 private:
  friend class WholeMessageParser<true, RequestParser>;
  ParsedFields& Fields() { return request_; }
  std::string& Body() { return request_.body_; }

  void on_request_impl(boost::beast::http::verb method, string_view method_string,
                       string_view target, int version, error_code&) override {
    request_.method_ = method;
    request_.method_text_.assign(method_string.data(), method_string.size());
    request_.target_.assign(target.data(), target.size());
    request_.version_ = static_cast<unsigned>(version);
    request_.text.reserve(ParsedFields::kTextBytes);
  }

  HttpRequest request_;
};

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

// What a server writes to ask a client for the body it announced with
// "Expect: 100-continue".
inline constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// Whether `req` (its header read) waits for a 100 Continue before it sends
// its body: an HTTP/1.1 request with an Expect field of 100-continue (RFC
// 9110 section 10.1.1; an HTTP/1.0 client's is ignored).
inline bool ExpectsContinue(const HttpRequest& req) {
  if (req.version() < 11) return false;
  for (const HttpRequest::Field& f : req.fields) {
    const std::string_view v = req.Value(f);
    if (f.name == boost::beast::http::field::expect &&
        boost::beast::iequals(boost::beast::string_view(v.data(), v.size()), "100-continue")) {
      return true;
    }
  }
  return false;
}

// What makes a parsed request unfit to decide on (answered 400), if anything.
inline std::optional<std::string> Malformed(const HttpRequest& req) {
  namespace http = boost::beast::http;
  // One walk of the fields counts what the rules below read.
  int hosts = 0;
  TransferCodings codings;
  for (const HttpRequest::Field& f : req.fields) {
    if (f.name == http::field::host) ++hosts;
    if (f.name == http::field::transfer_encoding) {
      const std::string_view v = req.Value(f);
      codings.Add(boost::beast::string_view(v.data(), v.size()));
    }
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
    // RFC 9110 section 9.3.8: the gateway does not forward one.
    return "a TRACE request carries no content";
  }
  const std::string_view target = req.target();
  if (target.empty() || (target.front() != '/' && !TargetAuthority(target))) {
    return internal::Cat(
        "the request target must be a path (origin form) or an http:// or https:// URL "
        "(absolute form), got \"",
        target.substr(0, 64), "\"");
  }
  return std::nullopt;
}

// The value of the request's first Host field (empty when none).
inline std::string_view HostField(const HttpRequest& req) {
  return req[boost::beast::http::field::host];
}

// The facts of a request for `method` and `target` (the request's own, or
// what X-Original-* describe), with `host_field` its Host field's value;
// `path_storage` and `host_storage` hold what they point into. A header is
// the first field of its name, its lines every field of its name, in the
// order they came (names compared without case).
inline RequestFacts FactsOf(const HttpRequest& req, std::string_view peer_ip,
                            std::string_view method, std::string_view target,
                            std::string_view host_field, std::string& path_storage,
                            std::string& host_storage) {
  RequestFacts facts;
  facts.method = method;
  facts.raw_path = TargetPath(target);
  path_storage = NormalizePath(facts.raw_path);
  facts.path = path_storage;
  facts.query = TargetQuery(target);
  // An absolute-form target names the host itself, and the Host header is
  // then ignored (RFC 9112 section 3.2.2), as the upstream will.
  const std::optional<std::string_view> authority = TargetAuthority(target);
  host_storage = internal::AsciiLower(HostName(authority ? *authority : host_field));
  facts.host = host_storage;
  facts.peer_ip = peer_ip;
  facts.header = [&req](std::string_view name) { return req.Find(name); };
  facts.header_lines = [&req](std::string_view name) {
    std::vector<std::string_view> lines;
    for (const HttpRequest::Field& f : req.fields) {
      if (f.kept && SameName(req.Name(f), name)) lines.push_back(req.Value(f));
    }
    return lines;
  };
  facts.cgi_lines = [&req](std::string_view name) {
    std::vector<std::string_view> lines;
    for (const HttpRequest::Field& f : req.fields) {
      if (f.kept && SameNameToCgi(req.Name(f), name)) lines.push_back(req.Value(f));
    }
    return lines;
  };
  // A key header is read as an upstream may read it: `X_Api_Key` is
  // `X-Api-Key` to a CGI-style reader (SameNameToCgi), so the two together
  // are the header sent twice.
  facts.header_once = [&req](std::string_view name) -> std::optional<std::string_view> {
    std::optional<std::string_view> value;
    for (const HttpRequest::Field& f : req.fields) {
      if (!f.kept || !SameNameToCgi(req.Name(f), name)) continue;
      if (value) return std::nullopt;
      value = req.Value(f);
    }
    return value;
  };
  return facts;
}

// The same for the request's own method and target.
inline RequestFacts FactsOf(const HttpRequest& req, std::string_view peer_ip,
                            std::string_view method, std::string_view target,
                            std::string& path_storage, std::string& host_storage) {
  return FactsOf(req, peer_ip, method, target, HostField(req), path_storage, host_storage);
}

// The facts of the request an NGINX auth_request subrequest describes:
// X-Original-Method (default GET), X-Original-URI (default /) and
// X-Original-Host (default the Host rules above). The fields are read in
// one walk, the first of each name.
inline RequestFacts AuthFactsOf(const HttpRequest& req, std::string_view peer_ip,
                                std::string& path_storage, std::string& host_storage) {
  namespace http = boost::beast::http;
  std::optional<std::string_view> method, uri, original_host, host;
  const auto take = [&req](std::optional<std::string_view>& slot, const HttpRequest::Field& f) {
    if (!slot) slot = req.Value(f);
  };
  for (const HttpRequest::Field& f : req.fields) {
    if (f.name == http::field::host) {
      take(host, f);
      continue;
    }
    const std::string_view n = req.Name(f);
    if (n.size() < 14 || !SameName(n.substr(0, 11), "X-Original-")) continue;
    const std::string_view rest = n.substr(11);
    if (SameName(rest, "Method")) {
      take(method, f);
    } else if (SameName(rest, "URI")) {
      take(uri, f);
    } else if (SameName(rest, "Host")) {
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

#endif  // SLUICE_SERVER_HTTP_REQUEST_H_
