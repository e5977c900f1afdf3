// What an upstream answers on one connection, as the gateway reads and
// relays it (gateway.cc's Forward): AnswerParser with the gateway's body
// limit, interim 1xx answers read and dropped until a final one, then
// ForClient and the head AppendHead writes, for each client version, the
// client's keep-alive and the session's, and for the answer to a GET and to
// a HEAD (the first byte's low bit).
//
// Traps: what a client reads of the relayed bytes must be one whole answer
// and nothing after it (bytes left over would be read as the next answer),
// with the upstream's body, framed by one Content-Length of that body
// (none on a 1xx or 204), no hop-by-hop field but the Connection sluice
// writes, and the keep-alive sluice decided.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/upstream_answer.h"
#include "server/wire.h"
#include "server_fixture.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using sluice::server::AnswerParser;
using sluice::server::UpstreamAnswer;

constexpr uint64_t kBodyLimit = 1024 * 1024;  // the gateway's is 64 MiB; the inputs are small

// The final answer in `bytes`, as the gateway's loop reads it; nullopt when
// the upstream's bytes are no answer (a 502).
std::optional<UpstreamAnswer> Read(std::string_view bytes, bool head) {
  boost::asio::const_buffer rest(bytes.data(), bytes.size());
  for (;;) {
    AnswerParser parser;
    parser.body_limit(kBodyLimit);
    parser.skip(head);
    parser.eager(true);
    if (!sluice::fuzz::Feed(parser, rest)) return std::nullopt;
    const int status = parser.get().status;
    if (status >= 100 && status < 200 && status != 101) continue;  // interim: the next
    if (status == 101) return std::nullopt;
    return parser.release();
  }
}

void Check(const UpstreamAnswer& read, unsigned version, bool client_keep_alive,
           bool session_keep_alive, bool head) {
  UpstreamAnswer answer = read;
  if (!sluice::server::ForClient(answer, version, client_keep_alive, head)) return;  // a 502
  const std::string body_sent = head ? std::string() : answer.body;
  const int status = answer.status;
  sluice::server::Reply reply =
      sluice::server::Relayed{.answer = std::move(answer), .fields = {{"RateLimit", "x"}}};
  std::string bytes;
  const std::string_view body = AppendHead(reply, version, session_keep_alive, head, bytes);
  bytes += body;

  http::response_parser<http::string_body> back;
  back.body_limit(kBodyLimit);
  back.skip(head);
  back.eager(true);
  beast::error_code ec;
  const size_t used = back.put(boost::asio::buffer(bytes), ec);
  if (ec == http::error::need_more) {
    // Only an answer framed by the connection's end may want more: sluice
    // always frames what it relays.
    __builtin_trap();
  }
  if (ec || !back.is_done()) __builtin_trap();  // the client cannot read it
  if (used != bytes.size()) __builtin_trap();   // bytes after the answer
  const auto& res = back.get();
  if (static_cast<int>(res.result_int()) != status || res.version() != version) __builtin_trap();
  if (res.body() != body_sent) __builtin_trap();
  if (res.keep_alive() != (client_keep_alive && session_keep_alive)) __builtin_trap();
  int lengths = 0;
  for (const auto& f : res) {
    if (f.name() == http::field::connection) {
      const std::string_view v(f.value().data(), f.value().size());
      if (v != "close" && v != "keep-alive") __builtin_trap();
      continue;
    }
    if (sluice::server::IsHopByHop(f.name())) __builtin_trap();
    if (f.name() == http::field::content_length) ++lengths;
  }
  if (lengths > 1) __builtin_trap();
  const bool bodiless = status / 100 == 1 || status == 204;
  if (bodiless && lengths != 0) __builtin_trap();
  if (!bodiless && !head && status != 304 &&
      (lengths != 1 || res[http::field::content_length] != std::to_string(body_sent.size()))) {
    __builtin_trap();
  }
}

// The same answer, its body streamed as it comes (gateway.cc's
// StreamsItsBody, server.cc's StreamBody): the head as ForClientStreamed
// framed it, then the body in two parts (split at `cut`), chunked when it
// said so, and the last chunk. A client must read one whole answer with
// the upstream's body, ended where sluice says (by the connection's end
// only for an HTTP/1.0 client of a body of unsaid length).
void CheckStreamed(const UpstreamAnswer& read, unsigned version, bool client_keep_alive,
                   size_t cut) {
  const int status = read.status;
  if (status / 100 == 1 || status == 204 || status == 304) return;  // never streamed
  UpstreamAnswer answer = read;
  const std::string body = answer.body;
  answer.body.clear();
  bool chunked = false;
  if (!sluice::server::ForClientStreamed(answer, version, client_keep_alive, read.said_length,
                                         chunked)) {
    return;  // a 502
  }
  const bool keep_alive = answer.keep_alive;
  sluice::server::Relayed relayed{.answer = std::move(answer), .fields = {{"RateLimit", "x"}}};
  relayed.body_to_come = true;
  relayed.chunked = chunked;
  sluice::server::Reply reply = std::move(relayed);
  std::string bytes;
  if (!AppendHead(reply, version, client_keep_alive, false, bytes).empty()) __builtin_trap();
  cut = std::min(cut, body.size());
  for (const std::string_view part :
       {std::string_view(body).substr(0, cut), std::string_view(body).substr(cut)}) {
    if (part.empty()) continue;
    if (chunked) {
      sluice::server::AppendChunk(part, bytes);
    } else {
      bytes += part;
    }
  }
  if (chunked) sluice::server::AppendChunk({}, bytes);

  http::response_parser<http::string_body> back;
  back.body_limit(kBodyLimit);
  back.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (!ec && used < bytes.size() && !back.is_done()) {
    const size_t n = back.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) ec = {};
    if (n == 0) break;
    used += n;
  }
  // An HTTP/1.0 client of a body of unsaid length reads it to the end.
  const bool to_the_end = version == 10 && !read.said_length.has_value();
  if (!ec && !back.is_done() && to_the_end && used == bytes.size()) back.put_eof(ec);
  if (ec || !back.is_done()) __builtin_trap();  // the client cannot read it, or would wait on
  if (used != bytes.size()) __builtin_trap();   // bytes after the answer
  if (back.get().body() != body) __builtin_trap();
  if (back.get().keep_alive() != keep_alive) __builtin_trap();
  if (keep_alive && !client_keep_alive) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool head = (data[0] & 1) != 0;
  const std::optional<UpstreamAnswer> read =
      Read(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), head);
  if (!read) return 0;
  for (const unsigned version : {10u, 11u}) {
    for (const bool client : {false, true}) {
      for (const bool session : {false, true}) Check(*read, version, client, session, head);
      if (!head) CheckStreamed(*read, version, client, data[0] >> 1);
    }
  }
  return 0;
}
