#include "server/wire.h"

#include <charconv>

#include <cstring>

#include <boost/beast/core/string.hpp>

namespace sluice::server {
namespace {

void AppendStatusLine(unsigned version, int status, std::string_view reason, std::string& out) {
  // As Beast writes it: the version's two digits and the code's three.
  const char line[] = {'H',
                       'T',
                       'T',
                       'P',
                       '/',
                       static_cast<char>('0' + version / 10 % 10),
                       '.',
                       static_cast<char>('0' + version % 10),
                       ' ',
                       static_cast<char>('0' + status / 100 % 10),
                       static_cast<char>('0' + status / 10 % 10),
                       static_cast<char>('0' + status % 10),
                       ' '};
  out.append(line, sizeof line);
  if (reason.empty()) reason = View(http::obsolete_reason(static_cast<http::status>(status)));
  out += reason;
  out += "\r\n";
}

// Whether `name` is one of `list`'s names, compared as field names are.
bool Named(std::string_view name, const HeaderList& list) {
  for (const auto& [listed, value] : list) {
    if (listed.size() == name.size() &&
        boost::beast::iequals(boost::beast::string_view(listed.data(), listed.size()),
                              boost::beast::string_view(name.data(), name.size()))) {
      return true;
    }
  }
  return false;
}

std::string_view AppendAnswerHead(const HttpAnswer& answer, unsigned version, bool keep_alive,
                                  bool head, std::string& out) {
  const int status = answer.status;
  AppendStatusLine(version, status, {}, out);
  out += "Server: sluice\r\n";  // (a field of literals: one append)
  if (!answer.body.empty() || status != 204) {
    out += "Content-Type: ";
    out += answer.content_type;
    out += "\r\n";
  }
  out += answer.headers.wire();
  if (version == 10 && keep_alive) AppendField("Connection", "keep-alive", out);
  if (version != 10 && !keep_alive) AppendField("Connection", "close", out);
  // RFC 9110 section 8.6: no Content-Length on a 1xx or a 204.
  if (status >= 200 && status != 204) AppendLength(answer.body.size(), out);
  out += "\r\n";
  if (head) return {};
  return answer.body;
}

std::string_view AppendResponseHead(Relayed& relayed, bool keep_alive, bool head,
                                    std::string& out) {
  UpstreamAnswer& a = relayed.answer;
  if (head && !a.body.empty()) {
    // A response to HEAD has the GET's header fields and no body (RFC 9110
    // section 9.3.2): a body here would be read by the client as the start
    // of the next response.
    for (UpstreamAnswer::Field& f : a.fields) {
      if (f.name == http::field::content_length) f.kept = false;
    }
    a.length = a.body.size();
    a.body.clear();
  }
  AppendStatusLine(a.version, a.status, a.reason, out);
  for (const UpstreamAnswer::Field& f : a.fields) {
    if (!f.kept) continue;
    const std::string_view name = a.Name(f);
    if (!relayed.fields.empty() && Named(name, relayed.fields)) continue;
    AppendField(name, a.Value(f), out);
  }
  if (relayed.websocket) {
    AppendField("Connection", "upgrade", out);
    AppendField("Upgrade", "websocket", out);
  } else {
    // As Beast's keep_alive() says it for the version.
    const bool alive = keep_alive && a.keep_alive;
    if (a.version == 10 && alive) AppendField("Connection", "keep-alive", out);
    if (a.version != 10 && !alive) AppendField("Connection", "close", out);
  }
  if (a.length) AppendLength(*a.length, out);
  if (relayed.chunked) AppendField("Transfer-Encoding", "chunked", out);
  out += relayed.fields.wire();
  out += "\r\n";
  if (relayed.body_to_come) return {};
  return a.body;
}

}  // namespace

std::string_view AppendHead(Reply& reply, unsigned version, bool keep_alive, bool head,
                            std::string& out) {
  if (const HttpAnswer* answer = std::get_if<HttpAnswer>(&reply)) {
    return AppendAnswerHead(*answer, version, keep_alive, head, out);
  }
  return AppendResponseHead(std::get<Relayed>(reply), keep_alive, head, out);
}

void AppendChunk(std::string_view data, std::string& out) {
  char size[20];
  const auto end = std::to_chars(size, size + sizeof(size), data.size(), 16).ptr;
  out.append(size, end);
  out += "\r\n";
  out.append(data.data(), data.size());
  out += "\r\n";
}

}  // namespace sluice::server
