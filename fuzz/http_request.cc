// Fuzz target: what a client sends on one connection to `sluice serve`:
// requests one after the other (keep-alive, pipelined), each read by the
// server's RequestParser (Beast's basic_parser) with the server's default limits (16 KiB of header,
// 1 MiB of body), checked (Malformed), then taken where server.cc takes it: the decision API's body
// (/v1/check), auth_request (/v1/auth, X-Original-* headers), /v1/keys/{policy}/{key}, or the
// gateway: target path, normalization, request facts (the host of an absolute-form target or of
// Host, without port, lower case; header lookup), route, matching policies,
// their keys (client_ip through X-Forwarded-For or Forwarded), decisions,
// and the request sent upstream (TargetForUpstream and ToUpstream: one
// Host, no hop-by-hop field or name with '_' left, the body framed by its length). Each request is
// decided from a trusted proxy (under both real_ip_header variants of the config) and from an
// untrusted peer.
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

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "policy/policy_set.h"
#include "policy/request_text.h"
#include "server/forwarding.h"
#include "server/http_request.h"
#include "server/json_body.h"
#include "server/wire.h"
#include "server_fixture.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using sluice::fuzz::Policies;
using sluice::fuzz::RealIp;
using sluice::policy::PolicySet;
using sluice::policy::RequestFacts;
using sluice::server::FactsOf;
using sluice::server::Malformed;
using Request = sluice::server::HttpRequest;

constexpr uint32_t kMaxHeaderBytes = 16 * 1024;  // server.max_header_bytes' default
constexpr uint64_t kMaxBodyBytes = 1024 * 1024;  // server.max_body_bytes' default

// The next request of a connection that sent `rest`, as server.cc reads
// it; `rest` moves past it. nullopt for a malformed or incomplete one
// (the server answers 400, 413 or 431, or waits for more).
std::optional<Request> Parse(boost::asio::const_buffer& rest) {
  sluice::server::RequestParser parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(kMaxBodyBytes);
  parser.eager(true);
  if (!sluice::fuzz::Feed(parser, rest)) return std::nullopt;
  return parser.release();
}

// server.cc's Auth: the request NGINX asks about, from X-Original-*.
void Auth(const PolicySet& set, const Request& req, std::string_view peer_ip,
          std::string_view path) {
  std::string path_storage, host;
  const RequestFacts facts = sluice::server::AuthFactsOf(req, peer_ip, path_storage, host);
  sluice::policy::PolicyList applying;
  if (path.size() > 9) {
    const sluice::policy::Policy* p = set.Find(path.substr(9));
    if (p == nullptr) return;  // 404
    applying.push_back(p);
  } else {
    applying = set.Matching(facts);
  }
  sluice::fuzz::DecideRequest(set, applying, facts, "");
}

// gateway.cc's Gateway, up to forwarding: the target and Host the upstream
// gets (TargetForUpstream), then what ToUpstream makes of the request.
void Gateway(const PolicySet& set, const Request& req, std::string_view peer_ip) {
  std::string path_storage, host;
  const std::string method(req.method_string());
  RequestFacts facts = FactsOf(req, peer_ip, method, req.target(), path_storage, host);
  const sluice::RouteConfig* route = set.RouteFor(facts);
  if (route == nullptr) return;  // 404
  // A POST whose body may name another method a policy limits: its body read.
  absl::InlinedVector<std::string, 2> body_methods;
  if (set.MayCountByBodyMethod(facts)) {
    body_methods = sluice::server::BodyMethods(req.Find(http::field::content_type), req.body());
    facts.body_methods = body_methods;
  }
  sluice::fuzz::DecideRequest(set, set.Matching(facts), facts, route->name);
  const bool upgrade = route->websocket && sluice::server::IsWebSocketHandshake(req);
  Request upstream = req;
  sluice::server::TargetForUpstream(upstream, route->upstream);
  // Then Forward: what goes to the upstream (a throw here is a crash).
  sluice::server::ToUpstream(upstream, peer_ip, "");
  if (upgrade) {  // a WebSocket handshake: still one request without a body
    upstream.Set("Connection", "upgrade");
    upstream.Set("Upgrade", "websocket");
  }
  // What the upstream reads, read by Beast's own request parser.
  std::string bytes;
  const std::string_view body = upstream.AppendHead(bytes);
  bytes += body;
  http::request_parser<http::string_body> sent;
  sent.eager(true);
  sent.header_limit(static_cast<uint32_t>(bytes.size()));
  sent.body_limit(body.size());
  beast::error_code ec;
  const size_t used = sent.put(boost::asio::buffer(bytes), ec);
  if (ec || !sent.is_done() || used != bytes.size()) {
    __builtin_trap();  // the upstream could not read it, or would read more than one request
  }
  int hosts = 0;
  for (const auto& f : sent.get()) {
    const bool upgrading =  // the two a WebSocket handshake keeps, as set above
        upgrade && (f.name() == http::field::connection || f.name() == http::field::upgrade);
    if ((sluice::server::IsHopByHop(f.name()) && !upgrading) || f.name() == http::field::expect ||
        beast::iequals(f.name_string(), "Sluice-Shadow-Denied") ||
        f.name_string().find('_') != beast::string_view::npos) {
      __builtin_trap();  // a field that must not reach the upstream
    }
    if (f.name() == http::field::host) ++hosts;
  }
  if (hosts != 1) __builtin_trap();  // an HTTP/1.1 request has one Host (RFC 9112 section 3.2)
  if (sent.get().body() != upstream.body()) {
    __builtin_trap();  // the upstream would read another body than the client sent
  }
  // The same request on a route that streams uploads (gateway.cc: its body
  // goes as it comes, with the length the client said or chunked): its head
  // and its body framed so read back as one request with the same body.
  if (upgrade) return;
  Request streamed = req;
  sluice::server::TargetForUpstream(streamed, route->upstream);
  const sluice::server::StreamedBody framing{
      req.body().size() % 2 == 0 ? std::optional<uint64_t>(req.body().size()) : std::nullopt};
  sluice::server::ToUpstream(streamed, peer_ip, "", false, &sluice::server::FromAnyPeer, false,
                             &framing);
  std::string wire;
  (void)streamed.AppendHead(wire);
  if (framing.length) {
    wire += req.body();
  } else {
    if (!req.body().empty()) sluice::server::AppendChunk(req.body(), wire);
    sluice::server::AppendChunk({}, wire);
  }
  http::request_parser<http::string_body> read_back;
  read_back.eager(true);
  read_back.header_limit(static_cast<uint32_t>(wire.size()));
  read_back.body_limit(req.body().size());
  const size_t took = read_back.put(boost::asio::buffer(wire), ec);
  if (ec || !read_back.is_done() || took != wire.size() || read_back.get().body() != req.body() ||
      read_back.get().count(http::field::content_length) +
              read_back.get().count(http::field::transfer_encoding) !=
          1) {
    __builtin_trap();  // not one request with the client's body, framed one way
  }
}

// One request, as server.cc's Session and Handle take it: from a trusted
// proxy under both real_ip_header variants, and from an untrusted peer.
void Handle(const Request& req) {
  const std::string_view path = sluice::policy::TargetPath(req.target());
  const bool decision_path =
      path == "/v1/check" || path == "/v1/auth" || path.substr(0, 9) == "/v1/auth/";
  if (decision_path) {
    (void)sluice::policy::BearerTokenIn(Policies().config().server.decision.tokens,
                                        req[http::field::authorization]);
  }
  if (path == "/v1/check") return sluice::fuzz::DecideCheckBody(req.body());
  if (path.substr(0, 9) == "/v1/keys/") sluice::fuzz::InspectKey(path.substr(9));  // admin
  const std::pair<std::string_view, RealIp> from[] = {
      {sluice::fuzz::kTrustedPeer, RealIp::kXForwardedFor},
      {sluice::fuzz::kTrustedPeer, RealIp::kForwarded},
      {sluice::fuzz::kUntrustedPeer, RealIp::kXForwardedFor}};
  for (const auto& [peer, real_ip] : from) {
    if (decision_path) {
      Auth(Policies(real_ip), req, peer, path);
    } else {
      Gateway(Policies(real_ip), req, peer);
    }
  }
}

}  // namespace

// The input is what a client sent on one connection: requests one after
// the other (keep-alive, pipelined), read until one is malformed or asks
// to close.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  boost::asio::const_buffer rest(data, size);
  while (rest.size() > 0) {
    const std::optional<Request> req = Parse(rest);
    if (!req || Malformed(*req)) break;  // answered 400 (or 413, 431), then closed
    Handle(*req);
    if (!req->keep_alive()) break;
  }
  return 0;
}
