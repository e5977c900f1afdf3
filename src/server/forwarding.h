// What the gateway changes in a request before it goes to the upstream, and
// in the upstream's answer before it goes to the client: the hop-by-hop
// fields dropped, sluice's own fields set, the framing made right for the
// next hop. Internal to the server; gateway.cc forwards with these and the
// HTTP fuzz target (fuzz/http_request.cc) runs them on every request it
// builds. Header-only and free of Asio.
//
// Thread-safety: pure functions of the message they are given.
#ifndef SLUICE_SERVER_FORWARDING_H_
#define SLUICE_SERVER_FORWARDING_H_

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "base/ascii.h"
#include "base/cat.h"
#include "server/http_request.h"
#include "server/parsed_fields.h"
#include "sluice/config.h"

namespace sluice::server {

// Set on a forwarded request, by sluice alone: the shadow policies that
// would have denied it.
inline constexpr std::string_view kShadowDeniedField = "Sluice-Shadow-Denied";

// The hop-by-hop fields every message loses (RFC 9110 section 7.6.1),
// besides those its Connection fields name.
inline bool IsHopByHop(boost::beast::http::field f) {
  namespace http = boost::beast::http;
  switch (f) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_authenticate:
    case http::field::proxy_authorization:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
      return true;
    default:
      return false;
  }
}

// How a message's body was framed, as its fields said.
struct Framing {
  int content_lengths = 0;       // its Content-Length fields
  std::string_view length_text;  // the value of the last one
  TransferCodings codings;       // what its Transfer-Encoding fields said

  bool transfer_encoding() const { return codings.fields > 0; }

  // Whether the message has one Content-Length field and it says `size` in
  // the canonical way (no sign, no leading zero): a field to keep as it is.
  bool SaysLength(size_t size) const {
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, size).ptr;
    return content_lengths == 1 && length_text == std::string_view(digits, end - digits);
  }
};

// Calls `f` with each name a Connection field's `value` lists (a
// comma-separated list; spaces and tabs around names, and empty elements,
// do not count).
template <typename F>
void ForEachConnectionName(std::string_view value, F f) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view token = value.substr(0, comma);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
      token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (!token.empty()) f(token);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
  }
}

// Whether `req` is a WebSocket opening handshake (RFC 6455 section 4.1): a
// GET over HTTP/1.1 without a body, whose Connection fields name
// `upgrade` and whose Upgrade fields name `websocket` (either in a list,
// in any case).
inline bool IsWebSocketHandshake(const HttpRequest& req) {
  namespace http = boost::beast::http;
  if (req.method() != http::verb::get || req.version() != 11) return false;
  bool connection = false, websocket = false;
  for (const ParsedFields::Field& f : req.fields) {
    if (!f.kept) continue;
    if (f.name == http::field::content_length && req.Value(f) != "0") return false;
    if (f.name == http::field::transfer_encoding) return false;
    if (f.name == http::field::connection || f.name == http::field::upgrade) {
      bool& named = f.name == http::field::connection ? connection : websocket;
      const std::string_view want = f.name == http::field::connection ? "upgrade" : "websocket";
      ForEachConnectionName(req.Value(f),
                            [&](std::string_view n) { named = named || SameName(n, want); });
    }
  }
  return connection && websocket;
}

// How many names a Connection field may list for DropHopByHop to compare
// them with each field as it walks the fields.
inline constexpr size_t kNamedInWalk = 8;

// Marks the hop-by-hop fields of `message` (RFC 9110 section 7.6.1: those
// of IsHopByHop and those its Connection fields name), and those
// `also_drop(field)` names, as not kept, and says how the fields that stay
// frame the body. A few names (the common case: none, or keep-alive) are
// compared with each field; more are looked up in a set, so that thousands
// of names beside thousands of fields cost their sum, not their product.
template <typename AlsoDrop>
Framing DropHopByHop(ParsedFields& message, AlsoDrop also_drop) {
  namespace http = boost::beast::http;
  absl::InlinedVector<std::string_view, kNamedInWalk> named;
  absl::flat_hash_set<std::string> many;
  for (const ParsedFields::Field& f : message.fields) {
    if (f.name != http::field::connection) continue;
    ForEachConnectionName(message.Value(f), [&](std::string_view n) {
      if (named.size() < kNamedInWalk) {
        named.push_back(n);
      } else {
        many.insert(internal::AsciiLower(n));
      }
    });
  }
  if (!many.empty()) {
    for (const std::string_view n : named) many.insert(internal::AsciiLower(n));
    named.clear();
  }
  Framing framing;
  for (ParsedFields::Field& f : message.fields) {
    if (f.name == http::field::transfer_encoding) {
      const std::string_view v = message.Value(f);
      framing.codings.Add(boost::beast::string_view(v.data(), v.size()));
    }
    const std::string_view name = message.Name(f);
    bool drop = IsHopByHop(f.name) || also_drop(f);
    // Host is end to end whatever a Connection field names: without it an
    // upstream would serve its default host, not the one decided on.
    const bool end_to_end = f.name == http::field::host;
    for (size_t i = 0; !drop && !end_to_end && i < named.size(); ++i) {
      drop = SameName(name, named[i]);
    }
    if (!drop && !end_to_end && !many.empty()) drop = many.contains(internal::AsciiLower(name));
    if (drop) f.kept = false;
    // Only a Content-Length that stays frames the message (one the
    // Connection field names goes like any other field it names).
    if (f.kept && f.name == http::field::content_length) {
      ++framing.content_lengths;
      framing.length_text = message.Value(f);
    }
  }
  return framing;
}

inline Framing DropHopByHop(ParsedFields& message) {
  return DropHopByHop(message, [](const ParsedFields::Field&) { return false; });
}

// The target and Host `req` goes to `upstream` with. An absolute-form
// target goes in origin form, with its host as Host, so that the upstream
// serves what the policies were decided on. An HTTP/1.0 request may come
// without Host (an HTTP/1.1 one without it was refused, Malformed); the
// HTTP/1.1 request it goes as needs one (RFC 9112 section 3.2), and an
// upstream answers 400 without it: the upstream's own, as NGINX sends.
inline void TargetForUpstream(HttpRequest& req, const HostPort& upstream) {
  if (const std::optional<std::string_view> authority = TargetAuthority(req.target())) {
    const std::string_view target = req.target();
    const std::string host(*authority);
    const std::string origin(target.substr(authority->data() + authority->size() - target.data()));
    req.target(origin.empty() || origin.front() != '/' ? internal::Cat("/", origin) : origin);
    req.Set("Host", host);
  } else if (req.version() < 11 && !req.Find(boost::beast::http::field::host)) {
    req.Set("Host", HostPortText(upstream, 80));
  }
}

// The fields besides X-Forwarded-For that upstreams and their middleware
// take from a proxy in front: a client's address in Forwarded (RFC 7239:
// Spring, Rack), X-Real-IP and True-Client-IP (chi's RealIP, NGINX's
// realip module), Client-IP (Rails), X-Client-IP (the request-ip package
// reads it first), CF-Connecting-IP, Fastly-Client-IP and
// X-Cluster-Client-IP (CDN and load balancer ones); the path in
// X-Original-URL and X-Rewrite-URL (set by IIS; Symfony before 2.8.44,
// 3.4.14 and 4.1.3 and Zend Framework routed by them, whoever sent them);
// and the request's host, scheme, port and path prefix as the client saw
// them: X-Forwarded-Host, -Port and -Prefix (Rails and Rack build absolute
// URLs, such as a password reset link, from the host; Spring's
// ForwardedHeaderFilter and Werkzeug's ProxyFix read all three),
// X-Forwarded-Proto, -Scheme and -Ssl, Front-End-Https and X-Url-Scheme
// (whether the client's connection was secure: Rack, Plack, PHP
// frameworks).
inline bool IsProxyField(std::string_view name) {
  switch (name.size()) {
    case 9:
      return SameName(name, "Forwarded") || SameName(name, "X-Real-IP") ||
             SameName(name, "Client-IP");
    case 11:
      return SameName(name, "X-Client-IP");
    case 12:
      return SameName(name, "X-Url-Scheme");
    case 13:
      return SameName(name, "X-Rewrite-URL");
    case 14:
      return SameName(name, "True-Client-IP") || SameName(name, "X-Original-URL");
    case 15:
      return SameName(name, "X-Forwarded-Ssl") || SameName(name, "Front-End-Https");
    case 16:
      return SameName(name, "CF-Connecting-IP") || SameName(name, "Fastly-Client-IP") ||
             SameName(name, "X-Forwarded-Host") || SameName(name, "X-Forwarded-Port");
    case 17:
      return SameName(name, "X-Forwarded-Proto");
    case 18:
      return SameName(name, "X-Forwarded-Prefix") || SameName(name, "X-Forwarded-Scheme");
    case 19:
      return SameName(name, "X-Cluster-Client-IP");
    default:
      return false;
  }
}

// ToUpstream's `from_proxy` when the caller trusts every peer.
inline bool FromAnyPeer() { return true; }

// A request body still coming that goes to the upstream as it comes
// (gateway.cc): `length`, the length its client said, or none (chunked).
struct StreamedBody {
  std::optional<uint64_t> length;
};

// `req` as it goes to the upstream: HTTP/1.1 on a kept-alive connection,
// without the hop-by-hop fields, Expect (sluice holds the whole body, so
// the upstream has nothing to wait for, and an interim 100 Continue must not
// reach the client), a client's own Sluice-Shadow-Denied, or fields whose
// names hold '_' unless `underscores` (ServerConfig::underscores_in_headers;
// `X_Forwarded_For` and `Sluice_Shadow_Denied` go even then), with
// `shadow_marker` there (when not empty) and the peer appended to the
// X-Forwarded-For list (every line of it, joined) when `from_proxy()` says
// the peer is a trusted proxy (asked at most once, and only of a request
// that has that field or an IsProxyField); from any other peer the list is
// the peer alone, so an upstream reading its left end cannot be handed an
// address the client made up, and the IsProxyField fields do not go. Only
// sluice sets the marker: it is set after the hop-by-hop fields are gone,
// so a client naming it in Connection cannot strip it. A request that came
// over TLS (`secure`) goes with "X-Forwarded-Proto: https" unless a trusted
// proxy's own X-Forwarded-Proto goes (its client's scheme). `req` passed
// Malformed.
template <typename FromProxy = bool (*)()>
void ToUpstream(HttpRequest& req, std::string_view peer_ip, std::string_view shadow_marker,
                bool underscores = false, FromProxy from_proxy = &FromAnyPeer, bool secure = false,
                const StreamedBody* streamed = nullptr) {
  namespace http = boost::beast::http;
  std::optional<bool> believed;  // from_proxy(), asked at most once
  const auto believe = [&] {
    if (!believed) believed = from_proxy();
    return *believed;
  };
  const Framing framing = DropHopByHop(req, [&](const ParsedFields::Field& f) {
    if (f.name == http::field::expect) return true;
    const std::string_view name = req.Name(f);
    if (IsProxyField(name)) return !believe();
    if (f.name != http::field::unknown) return false;
    if (name.find('_') == std::string_view::npos) return SameName(name, kShadowDeniedField);
    return !underscores || SameNameToCgi(name, kShadowDeniedField) ||
           SameNameToCgi(name, "X-Forwarded-For");
  });
  if (!shadow_marker.empty()) req.Set(kShadowDeniedField, shadow_marker);
  // Every X-Forwarded-For line the client's side sent, as one list (RFC
  // 9110 section 5.3: lines of one name are one list), then the peer. Only
  // the first line used to go: a hop a proxy had added on a line of its own
  // (HAProxy does) was lost, and an upstream reading the list from the
  // right took a client's own entry for its address.
  std::string xff;
  for (const ParsedFields::Field& f : req.fields) {
    if (!f.kept || !SameName(req.Name(f), "X-Forwarded-For") || req.Value(f).empty()) continue;
    if (!believe()) break;
    if (!xff.empty()) xff += ", ";
    xff += req.Value(f);
  }
  if (!xff.empty()) xff += ", ";
  xff += peer_ip;
  req.Set("X-Forwarded-For", xff);
  if (secure && !req.Find("X-Forwarded-Proto")) req.Set("X-Forwarded-Proto", "https");
  // No Connection field is left, and HTTP/1.1 keeps the connection alive
  // by default.
  req.version(11);
  // The framing: a body the client framed with one canonical Content-Length
  // keeps it (the parser read exactly that many bytes); a request with
  // neither field has no body and needs none, unless its method expects
  // one (POST, PUT and OPTIONS then say 0). The rest (a chunked body, a
  // Content-Length of 0 or written otherwise) get Beast's prepare_payload
  // rule: one canonical Content-Length when there is a body or the method
  // expects one, else none.
  if (streamed != nullptr) {
    // The body goes as it comes: with the length the client said, or
    // chunked as the client's was.
    req.Drop(http::field::content_length);
    if (streamed->length) {
      req.SetLength(static_cast<size_t>(*streamed->length));
    } else {
      req.Set("Transfer-Encoding", "chunked");
    }
    return;
  }
  const bool expects_length = req.method() == http::verb::post || req.method() == http::verb::put ||
                              req.method() == http::verb::options;
  const bool as_is =
      !framing.transfer_encoding() &&
      (framing.content_lengths > 0 ? !req.body().empty() && framing.SaysLength(req.body().size())
                                   : req.body().empty() && !expects_length);
  if (!as_is) {
    req.Drop(http::field::content_length);
    if (!req.body().empty() || expects_length) req.SetLength(req.body().size());
  }
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_FORWARDING_H_
