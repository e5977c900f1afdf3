#include "server/forwarding.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>

#include "base/ascii.h"
#include "gtest/gtest.h"
#include "server/http.h"
#include "server/upstream_answer.h"
#include "server/wire.h"

namespace sluice::server {
namespace {

// A message's fields as a sorted list of (lower-case name, value): what a
// next hop reads, whatever their order.
template <typename Message>
std::vector<std::pair<std::string, std::string>> FieldsOf(const Message& m) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : m) {
    out.emplace_back(internal::AsciiLower(View(f.name_string())), std::string(View(f.value())));
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <bool kIsRequest>
http::message<kIsRequest, http::string_body> Parse(const std::string& raw, bool head = false) {
  http::parser<kIsRequest, http::string_body> parser;
  parser.eager(true);
  if constexpr (!kIsRequest) parser.skip(head);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  if (!parser.is_done()) parser.put_eof(ec);
  EXPECT_FALSE(ec) << ec.message() << " " << raw;
  EXPECT_TRUE(parser.is_done()) << raw;
  return parser.release();
}

using BeastRequest = http::request<http::string_body>;

// `raw` as the server reads it.
HttpRequest ParseRequest(const std::string& raw) {
  RequestParser parser;
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  EXPECT_FALSE(ec) << ec.message() << " " << raw;
  EXPECT_TRUE(parser.is_done()) << raw;
  return parser.release();
}

// What an upstream reads of `req`: its head as the gateway writes it, and
// its body, read back by Beast.
BeastRequest Sent(const HttpRequest& req) {
  std::string bytes;
  const std::string_view body = req.AppendHead(bytes);
  bytes += body;
  return Parse<true>(bytes);
}

// The plain way, with Beast's own calls: every hop-by-hop name erased by
// name, the framing always recomputed by prepare_payload. The one walk of
// ToUpstream and ToClient must give what this gives.
template <typename Message>
void EraseHopByHopByName(Message& m) {
  std::vector<std::string> named;
  for (auto it = m.find(http::field::connection);
       it != m.end() && it->name() == http::field::connection; ++it) {
    std::istringstream tokens{std::string(View(it->value()))};
    for (std::string token; std::getline(tokens, token, ',');) {
      token.erase(0, token.find_first_not_of(" \t"));
      token.erase(token.find_last_not_of(" \t") + 1);
      if (!token.empty()) named.push_back(token);
    }
  }
  for (const std::string& name : named) {
    if (boost::beast::iequals(name, "host")) continue;  // end to end whatever Connection says
    m.erase(boost::beast::string_view(name.data(), name.size()));
  }
  for (http::field f :
       {http::field::connection, http::field::keep_alive, http::field::proxy_authenticate,
        http::field::proxy_authorization, http::field::te, http::field::trailer,
        http::field::transfer_encoding, http::field::upgrade}) {
    m.erase(f);
  }
}

void PlainToUpstream(BeastRequest& req, std::string_view peer_ip, std::string_view marker) {
  EraseHopByHopByName(req);
  req.erase("Sluice-Shadow-Denied");
  std::vector<std::string> underscored;  // NGINX's underscores_in_headers off
  for (const auto& f : req) {
    if (f.name_string().find('_') != boost::beast::string_view::npos) {
      underscored.emplace_back(f.name_string());
    }
  }
  for (const std::string& name : underscored) req.erase(name);
  if (!marker.empty()) req.set("Sluice-Shadow-Denied", std::string(marker));
  req.erase(http::field::expect);
  std::string xff;
  for (const auto& f : req) {
    if (!boost::beast::iequals(f.name_string(), "X-Forwarded-For") || f.value().empty()) continue;
    if (!xff.empty()) xff += ", ";
    xff += std::string(View(f.value()));
  }
  req.set("X-Forwarded-For",
          xff.empty() ? std::string(peer_ip) : xff + ", " + std::string(peer_ip));
  req.version(11);
  req.keep_alive(true);
  req.prepare_payload();
}

TEST(ForwardingTest, AWebSocketHandshakeIsAGetThatAsksForWebsocketAndUpgrade) {
  const std::string tail = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
  const auto is = [&](const std::string& head) {
    return IsWebSocketHandshake(ParseRequest(head + tail));
  };
  EXPECT_TRUE(is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"));
  // Lists and any case, as browsers and proxies write them.
  EXPECT_TRUE(
      is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: WebSocket\r\n"
         "Connection: keep-alive, upgrade\r\n"));
  EXPECT_TRUE(
      is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: h2c, websocket\r\n"
         "Connection: x\r\nConnection: UPGRADE\r\nContent-Length: 0\r\n"));
  // Not one: no Connection naming upgrade, another protocol, not a GET,
  // not HTTP/1.1, a body.
  EXPECT_FALSE(is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n"));
  EXPECT_FALSE(is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: close\r\n"));
  EXPECT_FALSE(is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n"));
  EXPECT_FALSE(is("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websockets\r\nConnection: Upgrade\r\n"));
  EXPECT_FALSE(is("POST /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"));
  EXPECT_FALSE(is("GET /ws HTTP/1.0\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"));
  EXPECT_FALSE(
      IsWebSocketHandshake(ParseRequest("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n"
                                        "Connection: Upgrade\r\nContent-Length: 2\r\n\r\nab")));
}

TEST(ForwardingTest, FieldsWithUnderscoresGoOnlyWhenTheOperatorSaysSo) {
  const std::string raw =
      "GET /a HTTP/1.1\r\nHost: h\r\nX_Api_Key: real\r\nX-Api-Key: fresh\r\n"
      "X_Forwarded_For: 1.2.3.4\r\nsluice_shadow_Denied: x\r\n\r\n";
  HttpRequest kept = ParseRequest(raw);
  ToUpstream(kept, "10.0.0.9", "", /*underscores=*/true);
  // Even then, the underscore forms of what sluice itself sets go.
  using Fields = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(FieldsOf(Sent(kept)), (Fields{{"host", "h"},
                                          {"x-api-key", "fresh"},
                                          {"x-forwarded-for", "10.0.0.9"},
                                          {"x_api_key", "real"}}));
  HttpRequest dropped = ParseRequest(raw);
  ToUpstream(dropped, "10.0.0.9", "");
  EXPECT_EQ(FieldsOf(Sent(dropped)),
            (Fields{{"host", "h"}, {"x-api-key", "fresh"}, {"x-forwarded-for", "10.0.0.9"}}));
}

TEST(ForwardingTest, AClientsOwnForwardedForGoesOnlyFromATrustedProxy) {
  const std::string raw =
      "GET /a HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.1\r\n"
      "x-forwarded-for: 198.51.100.2\r\n\r\n";
  int asked = 0;
  HttpRequest proxied = ParseRequest(raw);
  ToUpstream(proxied, "10.0.0.9", "", false, [&] { return ++asked > 0; });
  EXPECT_EQ(Sent(proxied)["X-Forwarded-For"], "198.51.100.1, 198.51.100.2, 10.0.0.9");
  HttpRequest direct = ParseRequest(raw);
  ToUpstream(direct, "10.0.0.9", "", false, [&] { return ++asked < 0; });
  EXPECT_EQ(Sent(direct)["X-Forwarded-For"], "10.0.0.9");
  EXPECT_EQ(asked, 2);  // once a request
  // Nor the other fields an upstream takes only from a proxy.
  const std::string named =
      "GET /a HTTP/1.1\r\nHost: h\r\nX-Real-IP: 198.51.100.1\r\nforwarded: for=198.51.100.1\r\n"
      "True-Client-IP: 1.1.1.1\r\nClient-IP: 1.1.1.2\r\nX-Client-IP: 1.1.1.3\r\n"
      "CF-Connecting-IP: 1.1.1.4\r\nFastly-Client-IP: 1.1.1.5\r\nX-Cluster-Client-IP: 1.1.1.6\r\n"
      "X-Original-URL: /login\r\nX-Rewrite-URL: /login\r\nX-Forwarded-Host: evil.example\r\n"
      "X-Forwarded-Port: 443\r\nX-Forwarded-Prefix: /app\r\nX-Forwarded-Proto: https\r\n"
      "X-Forwarded-Scheme: https\r\nX-Forwarded-Ssl: on\r\nFront-End-Https: on\r\n"
      "X-Url-Scheme: https\r\nX-Other: 7\r\n\r\n";
  HttpRequest untrusted = ParseRequest(named);
  ToUpstream(untrusted, "10.0.0.9", "", false, [] { return false; });
  using Fields = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(FieldsOf(Sent(untrusted)),
            (Fields{{"host", "h"}, {"x-forwarded-for", "10.0.0.9"}, {"x-other", "7"}}));
  HttpRequest trusted = ParseRequest(named);
  ToUpstream(trusted, "10.0.0.9", "", false, [] { return true; });
  EXPECT_EQ(FieldsOf(Sent(trusted)).size(), 21u);  // the 18, Host, X-Other, X-Forwarded-For
  HttpRequest none = ParseRequest("GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
  ToUpstream(none, "10.0.0.9", "", false, [&] { return ++asked > 0; });
  EXPECT_EQ(Sent(none)["X-Forwarded-For"], "10.0.0.9");
  EXPECT_EQ(asked, 2);  // not asked without the field
}

TEST(ForwardingTest, ARequestOverTlsSaysSoUnlessATrustedProxySaysItsClientsScheme) {
  const std::string forged = "GET /a HTTP/1.1\r\nHost: h\r\nX-Forwarded-Proto: http\r\n\r\n";
  HttpRequest direct = ParseRequest(forged);
  ToUpstream(
      direct, "10.0.0.9", "", false, [] { return false; }, /*secure=*/true);
  EXPECT_EQ(Sent(direct)["X-Forwarded-Proto"], "https");
  HttpRequest proxied = ParseRequest(forged);
  ToUpstream(
      proxied, "10.0.0.9", "", false, [] { return true; }, /*secure=*/true);
  EXPECT_EQ(Sent(proxied)["X-Forwarded-Proto"], "http");
  HttpRequest bare = ParseRequest("GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
  ToUpstream(
      bare, "10.0.0.9", "", false, [] { return true; }, /*secure=*/true);
  EXPECT_EQ(Sent(bare)["X-Forwarded-Proto"], "https");
  HttpRequest plain = ParseRequest(forged);
  ToUpstream(plain, "10.0.0.9", "", false, [] { return false; });
  EXPECT_EQ(Sent(plain).count("X-Forwarded-Proto"), 0u);
}

TEST(ForwardingTest, AKeyHeaderUnderBothSpellingsIsSentTwice) {
  EXPECT_TRUE(SameNameToCgi("X_Api_Key", "x-api-key"));
  EXPECT_TRUE(SameNameToCgi("x-api-key", "X-API-KEY"));
  EXPECT_FALSE(SameNameToCgi("X_Api_Key", "x-api-kez"));
  EXPECT_FALSE(SameNameToCgi("X[Api", "x{api"));  // '[' | 0x20 is '{': not letters
  std::string path, host;
  const HttpRequest both =
      ParseRequest("GET /a HTTP/1.1\r\nHost: h\r\nX-Api-Key: fresh\r\nX_API_KEY: real\r\n\r\n");
  EXPECT_EQ(FactsOf(both, "1.2.3.4", "GET", "/a", path, host).header_once("x-api-key"),
            std::nullopt);
  const HttpRequest underscored =
      ParseRequest("GET /a HTTP/1.1\r\nHost: h\r\nX_Api_Key: real\r\n\r\n");
  EXPECT_EQ(FactsOf(underscored, "1.2.3.4", "GET", "/a", path, host).header_once("x-api-key"),
            "real");
}

TEST(ForwardingTest, ARequestGoesUpstreamAsBeastsOwnCallsWouldMakeIt) {
  const std::string requests[] = {
      "GET /a HTTP/1.1\r\nHost: h\r\nX-Key: k\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n"
      "TE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: Basic eA==\r\nX-Stay: 2\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nx-hop: 1\r\nCONNECTION: x-HOP\r\nX-Hop: 2\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nSluice-Shadow-Denied: forged\r\n"
      "sluice-shadow-denied: again\r\nExpect: 100-continue\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nConnection: Sluice-Shadow-Denied\r\n\r\n",
      // Host stays: an upstream without it serves its default host.
      "GET /a HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, HOST\r\n\r\n",
      // Names with '_' go: a CGI-style upstream reads them as the '-' names.
      "GET /a HTTP/1.1\r\nHost: h\r\nX_Api_Key: real\r\nX-Api-Key: fresh\r\n"
      "X_Forwarded_For: 1.2.3.4\r\nsluice_shadow_denied: x\r\n_: 1\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n\r\n",
      "GET /a HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n",
      "GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
      "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello",
      "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      "PATCH /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "POST /a HTTP/1.1\r\nHost: h\r\n\r\n",
      "PUT /a HTTP/1.1\r\nHost: h\r\n\r\n",
      "OPTIONS /a HTTP/1.1\r\nHost: h\r\n\r\n",
      "DELETE /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
      "PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 05\r\n\r\nhello",
      // A Content-Length the Connection field names goes; the body still
      // goes upstream with its length.
      "POST /a HTTP/1.1\r\nHost: h\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello",
      "POST /a HTTP/1.1\r\nHost: h\r\nConnection: a, b, c, d, e, f, g, h, i, content-length, "
      "X-K\r\n"
      "Content-Length: 5\r\nX-K: 1\r\nI: 2\r\nX-Stay: 3\r\n\r\nhello",
      "GET /a HTTP/1.1\r\nHost: h\r\nConnection: a, b, c, d, e, f, g, h, i, j\r\nB: 1\r\nJ: 2\r\n"
      "X-Stay: 3\r\n\r\n",
      "TRACE /a HTTP/1.1\r\nHost: h\r\n\r\n",
      "HEAD /a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
  };
  // Many names and many fields: each name erased by name after the walk.
  std::string many = "PUT /a HTTP/1.1\r\nHost: h\r\nConnection: ";
  for (int i = 0; i < 300; ++i) many += "x" + std::to_string(i) + ", ";
  many += "content-length\r\n";
  for (int i = 0; i < 600; i += 2) many += "X" + std::to_string(i) + ": v\r\n";
  many += "Content-Length: 2\r\n\r\nok";
  std::vector<std::string> all(std::begin(requests), std::end(requests));
  all.push_back(many);
  for (const std::string& raw : all) {
    for (const std::string_view marker : {"", "\"trial\""}) {
      HttpRequest ours = ParseRequest(raw);
      ASSERT_EQ(Malformed(ours), std::nullopt) << raw;
      BeastRequest plain = Parse<true>(raw);
      ToUpstream(ours, "10.0.0.9", marker);
      PlainToUpstream(plain, "10.0.0.9", marker);
      const BeastRequest sent = Sent(ours);
      EXPECT_EQ(FieldsOf(sent), FieldsOf(plain)) << raw << " marker " << marker;
      EXPECT_EQ(sent.version(), 11u);
      EXPECT_EQ(sent.body(), plain.body());
      EXPECT_TRUE(sent.keep_alive()) << raw;
    }
  }
}

// Every X-Forwarded-For line goes upstream, joined into one list in the
// order they came, the peer last: a hop a proxy added on a line of its own
// is not lost, so an upstream reading the list from the right does not
// reach what the client wrote itself.
TEST(ForwardingTest, EveryForwardedForLineGoesUpstreamInOneList) {
  HttpRequest req = ParseRequest(
      "GET /a HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 6.6.6.6\r\nX-Other: 1\r\n"
      "x-forwarded-for: 1.2.3.4\r\nX-Forwarded-For:\r\n\r\n");
  ToUpstream(req, "10.0.0.9", "");
  const BeastRequest sent = Sent(req);
  EXPECT_EQ(sent.count("X-Forwarded-For"), 1u);
  EXPECT_EQ(View(sent["X-Forwarded-For"]), "6.6.6.6, 1.2.3.4, 10.0.0.9");
  HttpRequest none = ParseRequest("GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
  ToUpstream(none, "10.0.0.9", "");
  EXPECT_EQ(View(Sent(none)["X-Forwarded-For"]), "10.0.0.9");
}

TEST(ForwardingTest, AChunkedBodyGoesUpstreamWithItsLength) {
  HttpRequest req = ParseRequest(
      "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  ToUpstream(req, "10.0.0.9", "");
  const BeastRequest sent = Sent(req);
  EXPECT_EQ(View(sent[http::field::content_length]), "5");
  EXPECT_EQ(sent.count(http::field::transfer_encoding), 0u);
  EXPECT_EQ(sent.body(), "hello");
}

// A chunked body's trailer fields go nowhere (RFC 9110 section 6.5.2: not
// merged into the header section). Merged, a second X-Api-Key there reached
// an upstream that reads a field's last value, after the first was limited.
TEST(ForwardingTest, AChunkedBodysTrailerFieldsAreDropped) {
  HttpRequest req = ParseRequest(
      "POST /a HTTP/1.1\r\nHost: h\r\nX-Api-Key: limited\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\nX-Api-Key: other\r\nX-Trailer-Only: t\r\n\r\n");
  EXPECT_EQ(req.Find("X-Trailer-Only"), std::nullopt);
  ToUpstream(req, "10.0.0.9", "");
  const BeastRequest sent = Sent(req);
  EXPECT_EQ(sent.count("X-Api-Key"), 1u);
  EXPECT_EQ(View(sent["X-Api-Key"]), "limited");
  EXPECT_EQ(sent.count("X-Trailer-Only"), 0u);
  EXPECT_EQ(sent.body(), "hello");
}

// What a client reads of `raw`, an upstream's answer, relayed: read by
// AnswerParser, made ready by ForClient, written by AppendHead (the
// session's own keep-alive `keep_alive` too), read back by Beast.
Response Relayed(const std::string& raw, unsigned version, bool keep_alive, bool head) {
  AnswerParser parser;
  parser.eager(true);
  parser.skip(head);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  if (!parser.is_done()) parser.put_eof(ec);
  EXPECT_FALSE(ec) << ec.message() << " " << raw;
  EXPECT_TRUE(parser.is_done()) << raw;
  UpstreamAnswer answer = parser.release();
  EXPECT_TRUE(ForClient(answer, version, keep_alive, head)) << raw;
  Reply reply = server::Relayed{std::move(answer), {}};
  std::string bytes;
  bytes += AppendHead(reply, version, keep_alive, head, bytes);
  http::response_parser<http::string_body> back;
  back.eager(true);
  back.skip(head);
  back.put(boost::asio::buffer(bytes), ec);
  if (!back.is_done()) back.put_eof(ec);
  EXPECT_FALSE(ec) << ec.message() << " " << bytes;
  EXPECT_TRUE(back.is_done()) << bytes;
  return back.release();
}

// A chunked answer's trailer fields do not reach the client either: the
// answer goes with one Content-Length and its header as the upstream sent it.
TEST(ForwardingTest, AChunkedAnswersTrailerFieldsAreDropped) {
  const Response sent = Relayed(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
      "5\r\nhello\r\n0\r\nX-A: 2\r\nSet-Cookie: s=t\r\n\r\n",
      11, true, false);
  EXPECT_EQ(sent.count("X-A"), 1u);
  EXPECT_EQ(View(sent["X-A"]), "1");
  EXPECT_EQ(sent.count(http::field::set_cookie), 0u);
  EXPECT_EQ(View(sent[http::field::content_length]), "5");
  EXPECT_EQ(sent.body(), "hello");
}

TEST(ForwardingTest, AnUpstreamAnswerGoesToTheClientAsBeastsOwnCallsWouldMakeIt) {
  struct Case {
    std::string raw;
    bool head;
  };
  std::vector<Case> answers = {
      {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
       "\r\nhello",
       false},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
       false},
      {"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello", false},
      {"HTTP/1.1 200 OK\r\nConnection: X-Up\r\nX-Up: 1\r\nContent-Length: 2\r\n\r\nok", false},
      {"HTTP/1.1 200 OK\r\nx-up: 1\r\nCONNECTION: x-UP, te\r\nX-Up: 2\r\nTE: t\r\nTrailer: x\r\n"
       "Proxy-Authenticate: y\r\nUpgrade: z\r\nX-Stay: 3\r\nContent-Length: 2\r\n\r\nok",
       false},
      {"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\nok", false},
      {"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n", false},
      {"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", false},
      {"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", false},
      {"HTTP/1.1 204 No Content\r\n\r\n", false},
      {"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", false},
      {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false},
      {"HTTP/1.1 200 OK\r\nContent-Length: 002\r\n\r\nok", false},
      {"HTTP/1.1 201 Made It\r\nX-B: 2\r\nX-B: 3\r\n\r\n", false},
      {"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nUpgrade: h2\r\n\r\n", true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true},
  };
  // Many names and many fields: the names looked up in a set.
  std::string many = "HTTP/1.1 200 OK\r\nConnection: ";
  for (int i = 0; i < 300; ++i) many += "x" + std::to_string(i) + ", ";
  many += "content-length\r\n";
  for (int i = 0; i < 600; i += 2) many += "X" + std::to_string(i) + ": v\r\n";
  many += "Content-Length: 2\r\n\r\nok";
  answers.push_back({many, false});
  for (const Case& c : answers) {
    for (const unsigned version : {10u, 11u}) {
      for (const bool keep_alive : {false, true}) {
        Response plain = Parse<false>(c.raw, c.head);
        EraseHopByHopByName(plain);
        plain.version(version);
        plain.keep_alive(keep_alive);
        if (!c.head && plain.result() != http::status::not_modified) plain.prepare_payload();
        // RFC 9110 section 8.6: no Content-Length on a 1xx or a 204 (Beast's
        // prepare_payload writes one of 0); a 304's describes the GET's body,
        // as a HEAD's does, and stays as it came.
        const int status = plain.result_int();
        if (status / 100 == 1 || status == 204) plain.erase(http::field::content_length);
        const Response ours = Relayed(c.raw, version, keep_alive, c.head);
        EXPECT_EQ(FieldsOf(ours), FieldsOf(plain))
            << c.raw << " version " << version << " keep_alive " << keep_alive;
        EXPECT_EQ(ours.body(), plain.body());
        EXPECT_EQ(ours.keep_alive(), keep_alive);
        EXPECT_EQ(ours.version(), version);
        EXPECT_EQ(ours.result_int(), plain.result_int());
      }
    }
  }
}

TEST(ForwardingTest, AnAnswerCodedOtherThanChunkedAloneIsNotRelayed) {
  for (const std::string raw :
       {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n"}) {
    AnswerParser parser;
    parser.eager(true);
    boost::system::error_code ec;
    parser.put(boost::asio::buffer(raw), ec);
    if (!parser.is_done()) parser.put_eof(ec);
    ASSERT_TRUE(parser.is_done()) << raw;
    UpstreamAnswer answer = parser.release();
    EXPECT_FALSE(ForClient(answer, 11, true, false)) << raw;
  }
  const Response chunked =
      Relayed("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 11,
              true, false);
  EXPECT_EQ(View(chunked[http::field::content_length]), "5");
  EXPECT_EQ(chunked.body(), "hello");
}

// A HEAD's or a 304's Content-Length describes a body not sent: the length
// it said goes on, in one canonical field, however the upstream wrote it.
TEST(ForwardingTest, AHeadOr304AnswerSaysItsLengthInOneField) {
  for (const auto& [raw, head] : std::vector<std::pair<std::string, bool>>{
           {"HTTP/1.1 200 OK\r\nContent-Length: 007\r\nContent-Length: 7, 7\r\n\r\n", true},
           {"HTTP/1.1 304 Not Modified\r\nContent-Length: 7,7\r\n\r\n", false},
           {"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", true},
       }) {
    const Response ours = Relayed(raw, 11, true, head);
    EXPECT_EQ(ours.count(http::field::content_length), 1u) << raw;
    EXPECT_EQ(View(ours[http::field::content_length]), "7") << raw;
  }
  // A 204's is not relayed, to a HEAD either (RFC 9110 section 8.6).
  EXPECT_EQ(Relayed("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 11, true, true)
                .count(http::field::content_length),
            0u);
  // One the Connection field names is not relayed at all.
  const Response named = Relayed(
      "HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 7\r\n\r\n", 11, true, true);
  EXPECT_EQ(named.count(http::field::content_length), 0u);
}

// An answer whose Content-Length is past the body limit is refused, and no
// room is reserved for it (Beast 1.74 offers an eager parser that length
// when bytes follow the header).
TEST(ForwardingTest, AnAnswerLongerThanTheLimitIsRefusedWithoutRoomForIt) {
  for (const bool eager : {false, true}) {
    AnswerParser parser;
    parser.eager(eager);
    parser.body_limit(1024);
    boost::system::error_code ec;
    parser.put(boost::asio::buffer(
                   std::string("HTTP/1.1 200 OK\r\nContent-Length: 21288888888\r\n\r\n\r\nmore")),
               ec);
    EXPECT_EQ(ec, http::error::body_limit) << eager;
    EXPECT_LE(parser.get().body.capacity(), AnswerParser::kReserveBytes) << eager;
  }
}

// Settled costs read the answer's fields by name: the first kept one.
TEST(ForwardingTest, AnAnswersFieldIsFoundByNameAmongThoseKept) {
  AnswerParser parser;
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(
                 std::string("HTTP/1.1 200 OK\r\nConnection: X-Cost\r\nX-Cost: 9\r\nx-units: 3\r\n"
                             "X-Units: 4\r\nContent-Length: 0\r\n\r\n")),
             ec);
  ASSERT_TRUE(parser.is_done());
  UpstreamAnswer answer = parser.release();
  ASSERT_TRUE(ForClient(answer, 11, true, false));
  EXPECT_EQ(answer.Find("X-Units"), "3");
  EXPECT_EQ(answer.Find("x-cost"), std::nullopt);  // named by Connection: not kept
  EXPECT_EQ(answer.Find("X-Unit"), std::nullopt);
}

// The facts of a request read in one walk of its fields are those Beast's
// lookups by name give: the first field of each name, names compared
// without case.
TEST(HttpRequestTest, FactsReadInOneWalkAreThoseOfBeastsLookups) {
  for (const std::string raw : {
           "GET /v1/auth HTTP/1.1\r\nHost: A.example\r\n\r\n",
           "GET /v1/auth HTTP/1.1\r\nx-original-uri: /login?u=1\r\nHost: a\r\n"
           "X-ORIGINAL-METHOD: POST\r\nX-Original-Uri: /second\r\n"
           "X-Original-Host: B.Example:8080\r\nX-Key: k1\r\nx-key: k2\r\n\r\n",
           "GET /v1/auth HTTP/1.1\r\nHost: a\r\nX-Original-Method: \r\n"
           "X-Original-Method: PUT\r\nX-Original-URI:\r\nX-Original-Hos: c\r\n"
           "X-Original-Hosts: d\r\nX-Original-: e\r\n\r\n",
           "GET http://Up.Example/x HTTP/1.1\r\nHost: ignored\r\nX-Original-Host: \r\n\r\n",
           "GET /v1/auth HTTP/1.0\r\nX-Original-URI: http://h.example/a/../b\r\n\r\n",
       }) {
    const BeastRequest req = Parse<true>(raw);
    const HttpRequest ours = ParseRequest(raw);
    // The old reading, one lookup by name each.
    std::string_view method = View(req["X-Original-Method"]);
    if (method.empty()) method = "GET";
    std::string_view uri = View(req["X-Original-URI"]);
    if (uri.empty()) uri = "/";
    const std::string_view original_host = View(req["X-Original-Host"]);
    const std::optional<std::string_view> authority = TargetAuthority(uri);
    const std::string host =
        internal::AsciiLower(HostName(!original_host.empty() ? original_host
                                      : authority            ? *authority
                                                             : View(req[http::field::host])));

    std::string path_storage, host_storage;
    const RequestFacts facts = AuthFactsOf(ours, "10.0.0.1", path_storage, host_storage);
    EXPECT_EQ(facts.method, method) << raw;
    EXPECT_EQ(facts.path, NormalizePath(TargetPath(uri))) << raw;
    EXPECT_EQ(facts.host, host) << raw;
    for (const std::string_view name : {"x-key", "X-Key", "Host", "X-Original-URI", "X-Missing"}) {
      const auto it = req.find(boost::beast::string_view(name.data(), name.size()));
      const std::optional<std::string_view> expected =
          it == req.end() ? std::nullopt : std::optional<std::string_view>(View(it->value()));
      EXPECT_EQ(facts.header(name), expected) << raw << " " << name;
      std::vector<std::string_view> lines;
      const auto [begin, end] =
          req.equal_range(boost::beast::string_view(name.data(), name.size()));
      for (auto line = begin; line != end; ++line) lines.push_back(View(line->value()));
      EXPECT_EQ(facts.header_lines(name), lines) << raw << " " << name;
    }

    std::string own_path, own_host;
    const RequestFacts own = FactsOf(ours, "10.0.0.1", "GET", ours.target(), own_path, own_host);
    const std::optional<std::string_view> own_authority = TargetAuthority(View(req.target()));
    EXPECT_EQ(own.host, internal::AsciiLower(HostName(
                            own_authority ? *own_authority : View(req[http::field::host]))))
        << raw;
  }
}

TEST(HttpRequestTest, MalformedCountsHostsAndCodingsInOneWalk) {
  EXPECT_EQ(Malformed(ParseRequest("GET / HTTP/1.1\r\nHost: a\r\n\r\n")), std::nullopt);
  EXPECT_NE(Malformed(ParseRequest("GET / HTTP/1.1\r\nX: y\r\n\r\n")), std::nullopt);
  EXPECT_EQ(Malformed(ParseRequest("GET / HTTP/1.0\r\nX: y\r\n\r\n")), std::nullopt);
  EXPECT_NE(Malformed(ParseRequest("GET / HTTP/1.1\r\nHost: a\r\nX: y\r\nhost: b\r\n\r\n")),
            std::nullopt);
  EXPECT_NE(Malformed(ParseRequest("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")),
            std::nullopt);
  EXPECT_EQ(Malformed(ParseRequest("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                                   "\r\n5\r\nhello\r\n0\r\n\r\n")),
            std::nullopt);
}

// A request reads as Beast's message of it reads: its line, its body, its
// fields in the order they came with their names as they came, and
// whether its connection persists; but for a chunked body's trailer
// fields, which Beast adds to the header's and sluice drops.
TEST(HttpRequestTest, ARequestReadsAsBeastsMessageOfIt) {
  for (const std::string raw : {
           "GET /a?b=c HTTP/1.1\r\nHost: h\r\nx-KEY: k1\r\nX-Key: k2\r\n\r\n",
           "PURGE http://h.example/x HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
           "get /lower HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
           "POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
           "3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nTrailer-Field: t\r\n\r\n",
           "PUT /p HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nX-Empty:\r\n\r\nbody",
           "GET / HTTP/1.0\r\n\r\n",
           "GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, CLOSE\r\n\r\n",
       }) {
    const BeastRequest beast = Parse<true>(raw);
    const HttpRequest ours = ParseRequest(raw);
    EXPECT_EQ(ours.method(), beast.method()) << raw;
    EXPECT_EQ(ours.method_string(), View(beast.method_string())) << raw;
    EXPECT_EQ(ours.target(), View(beast.target())) << raw;
    EXPECT_EQ(ours.version(), beast.version()) << raw;
    EXPECT_EQ(ours.body(), beast.body()) << raw;
    EXPECT_EQ(ours.keep_alive(), beast.keep_alive()) << raw;
    std::vector<std::pair<std::string, std::string>> want, got;
    for (const auto& f : beast) {
      if (f.name_string() == "Trailer-Field") continue;
      want.emplace_back(View(f.name_string()), View(f.value()));
    }
    for (const HttpRequest::Field& f : ours.fields) {
      got.emplace_back(ours.Name(f), ours.Value(f));
      EXPECT_EQ(f.name, http::string_to_field(
                            boost::beast::string_view(ours.Name(f).data(), ours.Name(f).size())));
    }
    EXPECT_EQ(got, want) << raw;
  }
}

// A "close" in any Connection field ends the connection (RFC 9112 section
// 9.3: field lines of one name are one list); Beast's message reads only
// the first field.
TEST(HttpRequestTest, ACloseInAnyConnectionFieldEndsTheConnection) {
  EXPECT_FALSE(ParseRequest("GET / HTTP/1.1\r\nHost: h\r\nConnection: x-a\r\n"
                            "Connection: close\r\n\r\n")
                   .keep_alive());
  EXPECT_TRUE(ParseRequest("GET / HTTP/1.0\r\nConnection: x-a\r\n"
                           "Connection: keep-alive\r\n\r\n")
                  .keep_alive());
  EXPECT_FALSE(
      ParseRequest("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive());
  EXPECT_FALSE(ParseRequest("GET / HTTP/1.0\r\n\r\n").keep_alive());
  EXPECT_TRUE(ParseRequest("GET / HTTP/1.1\r\nHost: h\r\n\r\n").keep_alive());
}

// A field set for the upstream takes the place of the client's of that
// name, after every field kept; a field dropped is not written.
TEST(HttpRequestTest, AFieldSetReplacesTheClientsAndGoesLast) {
  HttpRequest req =
      ParseRequest("GET / HTTP/1.1\r\nhost: a\r\nX-One: 1\r\nHOST-ish: b\r\nX-Two: 2\r\n\r\n");
  req.Set("Host", "c.example");
  req.Drop(http::field::unknown);  // no name: drops nothing
  req.Drop("x-one");
  EXPECT_EQ(req[http::field::host], "");  // the client's is no longer kept
  std::string head;
  EXPECT_EQ(req.AppendHead(head), "");
  EXPECT_EQ(head, "GET / HTTP/1.1\r\nHOST-ish: b\r\nX-Two: 2\r\nHost: c.example\r\n\r\n");
}

// An HTTP/1.1 request that expects 100-continue waits to be asked for its
// body; an HTTP/1.0 one's expectation is ignored (RFC 9110 section 10.1.1).
TEST(HttpRequestTest, ARequestExpectsContinueOnlyAsHttp11WithThatExpectation) {
  EXPECT_TRUE(ExpectsContinue(ParseRequest(
      "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 0\r\n\r\n")));
  EXPECT_FALSE(ExpectsContinue(
      ParseRequest("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n")));
  EXPECT_FALSE(ExpectsContinue(ParseRequest(
      "POST / HTTP/1.1\r\nHost: h\r\nExpect: something-else\r\nContent-Length: 0\r\n\r\n")));
  EXPECT_FALSE(ExpectsContinue(ParseRequest("POST / HTTP/1.1\r\nHost: h\r\n\r\n")));
  EXPECT_EQ(kContinue, "HTTP/1.1 100 Continue\r\n\r\n");
}

}  // namespace
}  // namespace sluice::server
