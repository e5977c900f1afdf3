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
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/cat.h"
#include "server/beast_request.h"

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

// How many names a Connection field may list for DropHopByHop to compare
// them with each field as it walks the fields.
inline constexpr size_t kNamedInWalk = 8;

// Drops the hop-by-hop fields of `message`, and those `also_drop(field)`
// names, in one walk of its fields (a lookup per field name would walk the
// field tree once for each of the eight names, present or not).
template <typename Message, typename AlsoDrop>
Framing DropHopByHop(Message& message, AlsoDrop also_drop) {
  namespace http = boost::beast::http;
  Framing framing;
  // The names the Connection fields list, copied: those fields go too.
  std::vector<std::string> named;
  for (const auto& f : message) {
    if (f.name() != http::field::connection) continue;
    ForEachConnectionName(View(f.value()), [&](std::string_view n) { named.emplace_back(n); });
  }
  // A few names (the common case: none, or keep-alive) are compared with
  // each field in the walk; more are erased by name after it, a lookup each,
  // so that a client listing thousands of names beside thousands of fields
  // costs the fields plus the names, not their product.
  const bool compare_named = named.size() <= kNamedInWalk;
  for (auto it = message.begin(); it != message.end();) {
    const http::field name = it->name();
    if (name == http::field::transfer_encoding) framing.codings.Add(it->value());
    bool drop = IsHopByHop(name) || also_drop(*it);
    for (size_t i = 0; compare_named && !drop && i < named.size(); ++i) {
      drop = boost::beast::iequals(it->name_string(),
                                   boost::beast::string_view(named[i].data(), named[i].size()));
    }
    // Only a Content-Length that stays frames the message (one the
    // Connection field names goes like any other field it names).
    if (!drop && name == http::field::content_length) {
      ++framing.content_lengths;
      framing.length_text = View(it->value());
    }
    it = drop ? message.erase(it) : std::next(it);
  }
  if (!compare_named) {
    for (const std::string& n : named) message.erase(boost::beast::string_view(n.data(), n.size()));
    framing.content_lengths = 0;
    framing.length_text = {};
    for (const auto& f : message) {
      if (f.name() != http::field::content_length) continue;
      ++framing.content_lengths;
      framing.length_text = View(f.value());
    }
  }
  return framing;
}

template <typename Message>
Framing DropHopByHop(Message& message) {
  return DropHopByHop(message, [](const auto&) { return false; });
}

// `req` as it goes to the upstream: HTTP/1.1 on a kept-alive connection,
// without the hop-by-hop fields, Expect (sluice holds the whole body, so
// the upstream has nothing to wait for, and an interim 100 Continue must not
// reach the client) or a client's own Sluice-Shadow-Denied, with
// `shadow_marker` there (when not empty) and the peer appended to
// X-Forwarded-For. Only sluice sets the marker: it is set after the
// hop-by-hop fields are gone, so a client naming it in Connection cannot
// strip it. `req` passed Malformed.
inline void ToUpstream(BeastRequest& req, std::string_view peer_ip,
                       std::string_view shadow_marker) {
  namespace http = boost::beast::http;
  const Framing framing = DropHopByHop(req, [](const auto& f) {
    return f.name() == http::field::expect ||
           boost::beast::iequals(
               f.name_string(),
               boost::beast::string_view(kShadowDeniedField.data(), kShadowDeniedField.size()));
  });
  if (!shadow_marker.empty()) {
    req.set(boost::beast::string_view(kShadowDeniedField.data(), kShadowDeniedField.size()),
            boost::beast::string_view(shadow_marker.data(), shadow_marker.size()));
  }
  std::string xff(View(req["X-Forwarded-For"]));
  req.set("X-Forwarded-For",
          xff.empty() ? std::string(peer_ip) : internal::Cat(xff, ", ", peer_ip));
  // No Connection field is left, and HTTP/1.1 keeps the connection alive
  // by default.
  req.version(11);
  // The framing, as Beast's prepare_payload would make it, without its
  // lookups where it changes nothing: a body the client framed with one
  // canonical Content-Length keeps it (the parser read exactly that many
  // bytes); a request with neither field has no body and needs none, unless
  // its method expects one (POST, PUT and OPTIONS then say 0). The rest (a
  // chunked body, a Content-Length of 0 or written otherwise) get Beast's
  // rule, and the upstream a length in one canonical field.
  const bool expects_length = req.method() == http::verb::post || req.method() == http::verb::put ||
                              req.method() == http::verb::options;
  const bool as_is =
      !framing.transfer_encoding() &&
      (framing.content_lengths > 0 ? !req.body().empty() && framing.SaysLength(req.body().size())
                                   : req.body().empty() && !expects_length);
  if (!as_is) req.prepare_payload();
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_FORWARDING_H_
