// The bytes of a response: the status line and header fields, written into
// a buffer the connection keeps from one request to the next, and the body
// beside them (one gathered write, no copy). Beast's serializer walks a
// chain of buffer views for every field and cost about 7% of a request's
// CPU; sluice's own answers (HttpAnswer) never become a Beast message at all.
// The bytes are Beast's own for the same message: wire_test.cc holds the two
// side by side.
//
// Thread-safety: pure functions.
#ifndef SLUICE_SERVER_WIRE_H_
#define SLUICE_SERVER_WIRE_H_

#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include "server/answer.h"
#include "server/http.h"
#include "server/upstream_answer.h"

namespace sluice::server {

struct AfterHead;  // loop.h

// An upstream's answer relayed (as ForClient left it), and the fields
// sluice adds to it (the RateLimit fields): written after the upstream's,
// in place of any of the upstream's with the same name.
struct Relayed {
  UpstreamAnswer answer;
  HeaderList fields;
  // What goes on once the head is written, null for an answer read whole:
  // a WebSocket's tunnel (`websocket`: the answer is a 101 to a handshake
  // on a websocket route, written with Connection: upgrade and Upgrade:
  // websocket) or a body still coming (`body_to_come`: ForClientStreamed
  // framed it, `answer.body` is what came with the head, and the head is
  // written without it; `chunked` when it goes in chunks).
  std::shared_ptr<AfterHead> after;
  bool websocket = false;
  bool body_to_come = false;
  bool chunked = false;
};

// What the transport writes for a request: an answer of sluice's own, or a
// response relayed from an upstream.
using Reply = std::variant<HttpAnswer, Relayed>;

inline int StatusOf(const Reply& reply) {
  if (const HttpAnswer* a = std::get_if<HttpAnswer>(&reply)) return a->status;
  return std::get<Relayed>(reply).answer.status;
}

// Appends the head of `reply` as the answer to an HTTP/`version` request
// (10 or 11) and returns the body to send after it. Of an HttpAnswer:
// Server, Content-Type (none on a 204 without a body), the answer's fields,
// Connection where the version's default is not `keep_alive`, and
// Content-Length (none on a 1xx or a 204). A relayed answer is written as
// ForClient left it (the client's version, the fields kept, the framing),
// with the Connection field its version needs (a switch of protocols:
// Connection: upgrade and its Upgrade), and sluice's fields last; a
// streamed body's head says `Transfer-Encoding: chunked` when it goes in
// chunks, and its body (none returned) is the relay's to write. `head`: the answer to a
// HEAD, whose Content-Length is that of the body it does not send.
std::string_view AppendHead(Reply& reply, unsigned version, bool keep_alive, bool head,
                            std::string& out);

// Appends `data` as one chunk of a chunked body (RFC 9112 section 7.1):
// its size in hex, CRLF, the data, CRLF. Empty data is the last chunk.
void AppendChunk(std::string_view data, std::string& out);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_WIRE_H_
