// An upstream's answer as the gateway reads and relays it. Beast's parser
// (basic_parser: the status line, the fields, the framing, chunked bodies,
// the limits) reads it; the answer is kept as it came, its fields as text
// and offsets in their order (ParsedFields), instead of in Beast's field
// table, where each field is a node allocated and placed in a tree, found
// again to drop the hop-by-hop ones, and moved with the message on its way
// out. Internal to the server; header-only and free of Asio.
//
// Thread-safety: a value type; an AnswerParser is used by one coroutine.
#ifndef SLUICE_SERVER_UPSTREAM_ANSWER_H_
#define SLUICE_SERVER_UPSTREAM_ANSWER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>

#include "server/forwarding.h"
#include "server/parsed_fields.h"

namespace sluice::server {

struct UpstreamAnswer : ParsedFields {
  unsigned version = 11;  // the upstream's; the client's after ForClient
  int status = 0;
  std::string reason;
  std::string body;
  // Set by ForClient: what the client is told of the connection, and the
  // Content-Length written in place of the upstream's, if any.
  bool keep_alive = true;
  std::optional<size_t> length;
  // The length its Content-Length fields said (AnswerParser::release).
  std::optional<uint64_t> said_length;
};

// Reads one answer (an interim 1xx one is read like any other: a new
// parser reads the next). skip(true) for the answer to a HEAD.
class AnswerParser final : public WholeMessageParser<false, AnswerParser> {
 public:
  UpstreamAnswer& get() { return answer_; }
  UpstreamAnswer release() {
    if (is_header_done()) {
      if (const auto length = content_length()) answer_.said_length = *length;
    }
    return std::move(answer_);
  }

 private:
  friend class WholeMessageParser<false, AnswerParser>;
  ParsedFields& Fields() { return answer_; }
  std::string& Body() { return answer_.body; }

  void on_response_impl(int code, string_view reason, int version, error_code&) override {
    answer_.status = code;
    answer_.version = static_cast<unsigned>(version);
    answer_.reason.assign(reason.data(), reason.size());
    answer_.text.reserve(ParsedFields::kTextBytes);
  }

  UpstreamAnswer answer_;
};

// `answer`, read whole, as it goes to a client of HTTP `version` (10 or
// 11) that keeps the connection alive or not: without the hop-by-hop
// fields (RFC 9110 section 7.6.1: those of IsHopByHop and those its
// Connection fields name), its body framed by one canonical
// Content-Length; none on a 1xx or a 204 (RFC 9110 section 8.6). The
// answer to a HEAD and a 304 keep the length the upstream's Content-Length
// said (it describes the body a GET would have had), in one canonical
// field. False, for an answer that is not to be relayed, when it was
// transfer-coded other than chunked alone (a coding sluice does not undo,
// or a body framed by the connection's end): de-chunked without the field,
// the client would read coded bytes as the body.
[[nodiscard]] inline bool ForClient(UpstreamAnswer& answer, unsigned version, bool keep_alive,
                                    bool head) {
  namespace http = boost::beast::http;
  const Framing framing = DropHopByHop(answer);
  if (framing.codings.Other()) return false;
  answer.version = version;
  answer.keep_alive = keep_alive;
  answer.length.reset();
  const int s = answer.status;
  const bool bodiless = s / 100 == 1 || s == 204;
  if (!head && s != 304 && !bodiless && !framing.transfer_encoding() &&
      framing.SaysLength(answer.body.size())) {
    return true;  // its one Content-Length stays as it came
  }
  for (UpstreamAnswer::Field& f : answer.fields) {
    if (f.name == http::field::content_length) f.kept = false;
  }
  if (bodiless) return true;  // none, even on the answer to a HEAD
  if (head || s == 304) {
    // The length the upstream said, in one canonical field (it may have
    // said it in several, or as a list of the same number).
    if (framing.content_lengths > 0 && answer.said_length) answer.length = *answer.said_length;
  } else {
    answer.length = answer.body.size();
  }
  return true;
}

// ForClient for an answer whose body is still coming (streamed as it
// comes): the hop-by-hop fields dropped as there; its length the one its
// Content-Length said (`said`), when it said one and had no
// Transfer-Encoding; else, to an HTTP/1.1 client, sent in chunks
// (`chunked` set), and to an HTTP/1.0 one, ended by the connection's end
// (`keep_alive` cleared). False, for an answer that is not to be relayed,
// as ForClient.
[[nodiscard]] inline bool ForClientStreamed(UpstreamAnswer& answer, unsigned version,
                                            bool keep_alive, std::optional<uint64_t> said,
                                            bool& chunked) {
  namespace http = boost::beast::http;
  const Framing framing = DropHopByHop(answer);
  if (framing.codings.Other()) return false;
  for (UpstreamAnswer::Field& f : answer.fields) {
    if (f.name == http::field::content_length) f.kept = false;
  }
  answer.version = version;
  answer.length.reset();
  chunked = false;
  if (!framing.transfer_encoding() && said) {
    answer.length = static_cast<size_t>(*said);
  } else if (version == 11) {
    chunked = true;
  } else {
    keep_alive = false;
  }
  answer.keep_alive = keep_alive;
  return true;
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_UPSTREAM_ANSWER_H_
