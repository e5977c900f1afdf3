#include "server/wire.h"

#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>

#include "server/forwarding.h"

namespace sluice::server {
namespace {

// What Beast's serializer writes for `message` (a request or a response).
template <bool kRequest>
std::string BeastBytes(http::message<kRequest, http::string_body> message) {
  std::string bytes;
  http::serializer<kRequest, http::string_body> sr(message);
  boost::system::error_code ec;
  while (!sr.is_done()) {
    sr.next(ec, [&](boost::system::error_code&, const auto& buffers) {
      size_t n = 0;
      for (const auto& b : boost::beast::buffers_range_ref(buffers)) {
        bytes.append(static_cast<const char*>(b.data()), b.size());
        n += b.size();
      }
      sr.consume(n);
    });
    if (ec) return "error: " + ec.message();
  }
  return bytes;
}

// The answer as a Beast message, built the way the server built it before
// it wrote its own: fields set in order, then keep-alive, then the payload.
Response AsBeastMessage(const HttpAnswer& a, unsigned version, bool keep_alive, bool head) {
  Response res{static_cast<http::status>(a.status), version};
  res.set(http::field::server, "sluice");
  if (!a.body.empty() || a.status != 204)
    res.set(http::field::content_type,
            boost::beast::string_view(a.content_type.data(), a.content_type.size()));
  for (const auto& [name, value] : a.headers) {
    res.set(boost::beast::string_view(name.data(), name.size()),
            boost::beast::string_view(value.data(), value.size()));
  }
  res.body() = a.body;
  res.keep_alive(keep_alive);
  res.prepare_payload();
  if (head && !res.body().empty()) {
    const size_t length = res.body().size();
    res.body().clear();
    res.content_length(length);
  }
  return res;
}

std::string OurBytes(Reply reply, unsigned version, bool keep_alive, bool head) {
  std::string out = "left from before|";
  out.clear();
  const std::string_view body = AppendHead(reply, version, keep_alive, head, out);
  out += body;
  return out;
}

// An upstream's answer as the gateway has it: read by AnswerParser, made
// ready by ForClient for a client of `version` that keeps the connection
// alive or not.
UpstreamAnswer Answer(const std::string& raw, unsigned version, bool keep_alive, bool head) {
  AnswerParser parser;
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(parser.is_done());
  UpstreamAnswer answer = parser.release();
  EXPECT_TRUE(ForClient(answer, version, keep_alive, head));
  return answer;
}

// The same read by Beast, for what its serializer writes.
Response BeastAnswer(const std::string& raw) {
  http::response_parser<http::string_body> parser;
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  EXPECT_FALSE(ec) << ec.message();
  return parser.release();
}

class WireTest : public ::testing::TestWithParam<std::tuple<unsigned, bool, bool>> {};

TEST_P(WireTest, AnAnswerIsWrittenAsBeastWritesIt) {
  const auto [version, keep_alive, head] = GetParam();
  const HttpAnswer answers[] = {
      HttpAnswer::Json(
          200, R"({"allowed":true})",
          {{"RateLimit-Policy", R"("login";q=40;w=60)"}, {"RateLimit", R"("login";r=39;t=60)"}}),
      HttpAnswer::Problem(429, "too many requests", "over the limit"),
      HttpAnswer::Problem(400, "bad request", ""),
      HttpAnswer::Text(200, ""),
      HttpAnswer{403, "application/problem+json", "{}", {{"Retry-After", "3"}}},
      HttpAnswer{503, "text/plain", std::string(70000, 'x'), {}},
  };
  for (const HttpAnswer& a : answers) {
    EXPECT_EQ(OurBytes(a, version, keep_alive, head),
              BeastBytes(AsBeastMessage(a, version, keep_alive, head)))
        << a.status;
  }
}

TEST_P(WireTest, A204HasNoContentLengthNorType) {
  const auto [version, keep_alive, head] = GetParam();
  HttpAnswer a{204, "", "", {{"RateLimit", R"("auth";r=9;t=1)"}}};
  std::string beast = BeastBytes(AsBeastMessage(a, version, keep_alive, head));
  // Beast writes "Content-Length: 0" on a 204; RFC 9110 section 8.6 says a
  // server must not. Otherwise the same bytes.
  const size_t at = beast.find("Content-Length: 0\r\n");
  ASSERT_NE(at, std::string::npos) << beast;
  beast.erase(at, 19);
  EXPECT_EQ(OurBytes(a, version, keep_alive, head), beast);
  EXPECT_EQ(beast.find("Content-Type"), std::string::npos);
}

TEST_P(WireTest, ARelayedResponseIsWrittenAsItIs) {
  const auto [version, keep_alive, head] = GetParam();
  // Fields in the upstream's order, its own reason phrase, the client's
  // version and keep-alive.
  const std::string upstream =
      "HTTP/1.1 201 Made It\r\nX-B: 2\r\nContent-Type: text/plain\r\nX-A: 1\r\n"
      "Content-Length: 5\r\n\r\nhello";
  Response expected = BeastAnswer(upstream);
  expected.version(version);
  expected.keep_alive(keep_alive);
  if (head) {
    expected.body().clear();
    expected.content_length(5);
  }
  expected.set("RateLimit", R"("api";r=1;t=1)");  // sluice's fields go last
  EXPECT_EQ(OurBytes(Relayed{Answer(upstream, version, keep_alive, head),
                             {{"RateLimit", R"("api";r=1;t=1)"}}},
                     version, keep_alive, head),
            BeastBytes(expected));
}

TEST(WireRelayTest, SluicesFieldsTakeThePlaceOfTheUpstreamsOfTheSameName) {
  const std::string upstream =
      "HTTP/1.1 200 OK\r\nX-A: 1\r\nratelimit: upstream's\r\nRateLimit-Policy: upstream's\r\n"
      "Content-Length: 2\r\n\r\nok";
  Response expected = BeastAnswer(upstream);
  expected.set("RateLimit", "sluice's");
  expected.set("RateLimit-Policy", "sluice's too");
  const std::string bytes =
      OurBytes(Relayed{Answer(upstream, 11, true, false),
                       {{"RateLimit", "sluice's"}, {"RateLimit-Policy", "sluice's too"}}},
               11, true, false);
  EXPECT_EQ(bytes, BeastBytes(expected));
  EXPECT_EQ(bytes.find("upstream's"), std::string::npos) << bytes;
}

TEST(WireRequestTest, ARequestForTheUpstreamIsWrittenAsBeastWritesIt) {
  // As the gateway has it: read from the client, then made ready for the
  // upstream. Beast, reading the bytes, writes them back the same.
  for (const std::string raw :
       {"GET /app?x=1 HTTP/1.1\r\nHost: a\r\nX-Key: k1\r\n\r\n",
        "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        "PURGE /cache HTTP/1.0\r\nHost: a\r\n\r\n",
        "PUT /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"}) {
    RequestParser parser;
    parser.eager(true);
    boost::system::error_code ec;
    parser.put(boost::asio::buffer(raw), ec);
    ASSERT_FALSE(ec) << ec.message() << " " << raw;
    ASSERT_TRUE(parser.is_done()) << raw;
    HttpRequest req = parser.release();
    ToUpstream(req, "127.0.0.1", "");
    std::string ours;
    const std::string_view body = req.AppendHead(ours);
    ours += body;
    http::request_parser<http::string_body> beast;
    beast.eager(true);
    beast.put(boost::asio::buffer(ours), ec);
    ASSERT_FALSE(ec) << ec.message() << " " << ours;
    ASSERT_TRUE(beast.is_done()) << ours;
    EXPECT_EQ(ours, BeastBytes(beast.release())) << raw;
  }
}

TEST(WireRelayTest, DrainingClosesARelayedResponse) {
  const std::string bytes = OurBytes(
      Relayed{Answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 11, true, false), {}}, 11,
      /*keep_alive=*/false, false);
  EXPECT_NE(bytes.find("Connection: close\r\n"), std::string::npos) << bytes;
}

TEST(WireRelayTest, AStatusOfAnyThreeDigitsKeepsThem) {
  const std::string upstream = "HTTP/1.1 599 \r\nContent-Length: 0\r\n\r\n";
  const std::string bytes =
      OurBytes(Relayed{Answer(upstream, 11, true, false), {}}, 11, true, false);
  EXPECT_EQ(bytes.substr(0, 13), "HTTP/1.1 599 ");
  EXPECT_EQ(bytes, BeastBytes(BeastAnswer(upstream)));
}

TEST(WireRelayTest, ASwitchToWebSocketSaysUpgradeWithItsOwnFields) {
  Relayed tunnel{Answer("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Accept: abc=\r\n\r\n",
                        11, true, false),
                 {}};
  tunnel.websocket = true;
  EXPECT_EQ(OurBytes(std::move(tunnel), 11, true, false),
            "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: abc=\r\n"
            "Connection: upgrade\r\nUpgrade: websocket\r\n\r\n");
}

// A head whose body is still coming, as ForClientStreamed frames it for a
// client of `version`: `raw` is the head and the first part of its body.
Relayed Streamed(const std::string& raw, unsigned version, bool keep_alive) {
  AnswerParser parser;
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw), ec);
  if (ec == http::error::need_more) ec = {};
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(parser.is_header_done());
  EXPECT_FALSE(parser.is_done());
  const auto said = parser.content_length();
  Relayed relayed;
  relayed.answer = parser.release();
  EXPECT_TRUE(ForClientStreamed(relayed.answer, version, keep_alive,
                                said ? std::optional<uint64_t>(*said) : std::nullopt,
                                relayed.chunked));
  relayed.body_to_come = true;
  return relayed;
}

TEST(WireRelayTest, AStreamedBodysHeadSaysHowItEnds) {
  // Chunked from the upstream: chunked to an HTTP/1.1 client, as it comes.
  Relayed chunked = Streamed(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
      "\r\nb\r\ndata: one\n\n\r\n",
      11, true);
  EXPECT_TRUE(chunked.chunked);
  EXPECT_EQ(chunked.answer.body, "data: one\n\n");  // what the relay writes first
  std::string out;
  Reply reply = std::move(chunked);
  EXPECT_EQ(AppendHead(reply, 11, true, false, out), "");
  EXPECT_EQ(out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
  // A length said: kept, the body not chunked.
  Relayed sized = Streamed("HTTP/1.1 200 OK\r\nContent-Length: 3000000\r\n\r\nabc", 11, true);
  EXPECT_FALSE(sized.chunked);
  out.clear();
  reply = std::move(sized);
  EXPECT_EQ(AppendHead(reply, 11, true, false, out), "");
  EXPECT_EQ(out, "HTTP/1.1 200 OK\r\nContent-Length: 3000000\r\n\r\n");
  // No length, to an HTTP/1.0 client: the connection's end ends it.
  Relayed old = Streamed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 10, true);
  EXPECT_FALSE(old.chunked);
  EXPECT_FALSE(old.answer.keep_alive);
  // A coding sluice does not undo is not relayed.
  AnswerParser coded;
  boost::system::error_code ec;
  coded.put(boost::asio::buffer(
                std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")),
            ec);
  UpstreamAnswer answer = coded.release();
  bool is_chunked = false;
  EXPECT_FALSE(ForClientStreamed(answer, 11, true, std::nullopt, is_chunked));
}

INSTANTIATE_TEST_SUITE_P(VersionsKeepAliveHead, WireTest,
                         ::testing::Combine(::testing::Values(10u, 11u), ::testing::Bool(),
                                            ::testing::Bool()));

}  // namespace
}  // namespace sluice::server
