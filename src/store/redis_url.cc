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
  if (rest.starts_with("redis://")) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("rediss://")) {
    rest.remove_prefix(9);
    out.tls = true;
  } else {
    return absl::InvalidArgumentError(
        Cat("redis url \"", url, "\": must start with redis:// or, for TLS, rediss://"));
  }
  const size_t at = rest.rfind('@');
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
