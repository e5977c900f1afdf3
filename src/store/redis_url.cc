#include <charconv>

#include "base/cat.h"
#include "base/parse_number.h"
#include "sluice/store/redis_options.h"

// ParseRedisUrl lives in the store library (not the Redis store) so that the
// config loader can check a URL, with its file and line, without linking a
// Redis client.
namespace sluice {

using internal::Cat;
using internal::ParseWhole;

namespace {

// %XX escapes in the user information of a URL (a password may hold '@').
absl::StatusOr<std::string> Unescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    unsigned value = 0;
    const std::string_view hex = i + 2 < text.size() + 1 ? text.substr(i + 1, 2) : "";
    const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
    if (hex.size() != 2 || ec != std::errc() || end != hex.data() + 2) {
      return absl::InvalidArgumentError("a bad %-escape in the user information");
    }
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

struct HostAndPort {
  std::string host;
  uint16_t port = 6379;
};

absl::StatusOr<HostAndPort> ParseEndpoint(std::string_view text, std::string_view what) {
  HostAndPort ep;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {  // [v6]:port
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(Cat(what, " \"", text, "\": no ']'"));
    }
    ep.host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return absl::InvalidArgumentError(Cat(what, " \"", text, "\": expected ':' after ']'"));
      }
      port = text.substr(close + 2);
    }
  } else {
    const size_t colon = text.rfind(':');
    ep.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) port = text.substr(colon + 1);
  }
  if (ep.host.empty()) return absl::InvalidArgumentError(Cat(what, " \"", text, "\": no host"));
  if (!port.empty() && (!ParseWhole(port, ep.port) || ep.port == 0)) {
    return absl::InvalidArgumentError(Cat(what, " \"", text, "\": bad port \"", port, "\""));
  }
  return ep;
}

}  // namespace

absl::StatusOr<RedisUrl> ParseRedisUrl(std::string_view url) {
  RedisUrl out;
  std::string_view rest = url;
  bool unix_socket = false;
  if (rest.starts_with("redis://")) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("rediss://")) {
    rest.remove_prefix(9);
    out.tls = true;
  } else if (rest.starts_with("unix://")) {
    rest.remove_prefix(7);
    unix_socket = true;
  } else {
    return absl::InvalidArgumentError(
        Cat("redis url \"", url,
            "\": must start with redis://, rediss:// (TLS) or unix:// (a Unix socket)"));
  }
  // The user information ends at the last '@' (a password may hold one);
  // before a Unix socket's path, at the first "@/" (the path may hold one).
  const size_t at = !unix_socket            ? rest.rfind('@')
                    : rest.starts_with("/") ? std::string_view::npos
                                            : rest.find("@/");
  if (at != std::string_view::npos) {
    const std::string_view info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = info.find(':');
    absl::StatusOr<std::string> user = Unescape(info.substr(0, colon));
    if (!user.ok()) return absl::InvalidArgumentError(Cat("redis url: ", user.status().message()));
    out.user = *user;
    if (colon != std::string_view::npos) {
      absl::StatusOr<std::string> password = Unescape(info.substr(colon + 1));
      if (!password.ok()) {
        return absl::InvalidArgumentError(Cat("redis url: ", password.status().message()));
      }
      out.password = *password;
    } else {  // redis://password@host, as several clients accept
      out.password = out.user;
      out.user.clear();
    }
  }
  if (unix_socket) {
    // unix://[[user]:password@]/path/to/socket[?db=N]
    const size_t query = rest.find('?');
    out.socket_path = std::string(rest.substr(0, query));
    if (!out.socket_path.starts_with("/") || out.socket_path.size() < 2) {
      return absl::InvalidArgumentError(
          Cat("redis url \"", url, "\": expected unix:///the/socket's/absolute/path"));
    }
    if (query != std::string_view::npos) {
      const std::string_view q = rest.substr(query + 1);
      if (!q.starts_with("db=") || !ParseWhole(q.substr(3), out.database) || out.database < 0) {
        return absl::InvalidArgumentError(
            Cat("redis url \"", url, "\": the query may only be db=N (the database)"));
      }
    }
    return out;
  }
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!ParseWhole(db, out.database) || out.database < 0)) {
      return absl::InvalidArgumentError(Cat("redis url \"", url, "\": bad database \"", db, "\""));
    }
    rest = rest.substr(0, slash);
  }
  absl::StatusOr<HostAndPort> ep = ParseEndpoint(rest, "redis url");
  if (!ep.ok()) {
    // Quote the URL as given, not the part that was wrong.
    const std::string message(ep.status().message());
    const size_t reason = message.find("\": ");
    return absl::InvalidArgumentError(
        Cat("redis url \"", url, "\"",
            reason == std::string::npos ? ": " + message : message.substr(reason + 1)));
  }
  if (!ep.ok()) return ep.status();
  out.host = ep->host;
  out.port = ep->port;
  return out;
}

}  // namespace sluice
