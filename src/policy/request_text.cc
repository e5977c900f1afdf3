#include "policy/request_text.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "sluice/rate.h"

namespace sluice::policy {

std::optional<uint32_t> HexValue(std::string_view digits) {
  if (digits.empty() || digits.size() > 8) return std::nullopt;
  uint32_t value = 0;
  for (const char c : digits) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) return std::nullopt;
    value = value * 16 + static_cast<uint32_t>(digit);
  }
  return value;
}

std::optional<char> PercentByte(std::string_view s, size_t i) {
  if (s[i] != '%' || i + 2 >= s.size()) return std::nullopt;
  const std::optional<uint32_t> byte = HexValue(s.substr(i + 1, 2));
  if (!byte) return std::nullopt;
  return static_cast<char>(*byte);
}

std::optional<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    const std::optional<char> c = PercentByte(s, i);
    if (!c) return std::nullopt;
    out.push_back(*c);
    i += 2;
  }
  return out;
}

namespace {

// Whether `raw` is already what NormalizePath makes of it (nearly every
// path a client sends): a '/' then segments that are neither empty, "." nor
// "..", with no '%', ';' or '\\' and not starting with '(', and perhaps a
// '/' after the last.
bool IsNormalPath(std::string_view raw) {
  if (raw.empty() || raw.front() != '/') return false;
  size_t start = 1;
  while (start < raw.size()) {
    const size_t slash = raw.find('/', start);
    const std::string_view seg =
        raw.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty() || seg == "." || seg == ".." || seg.front() == '(' ||
        seg.find_first_of("%;\\") != std::string_view::npos) {
      return false;
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

}  // namespace

namespace {

// Whether `seg` is ASP.NET's cookieless tickets: "(", then one or more
// tickets, each a letter and its value in parentheses, then ")":
// "(S(abc))", "(X(1)S(abc))". ASP.NET's filter takes such a segment out of
// the path before IIS maps it to a file or a handler, so
// "/(S(x))/login.aspx" is "/login.aspx" there.
bool IsCookielessTickets(std::string_view seg) {
  if (seg.size() < 5 || seg.front() != '(' || seg.back() != ')') return false;
  std::string_view rest = seg.substr(1, seg.size() - 2);
  while (!rest.empty()) {
    if (rest.size() < 3 || !absl::ascii_isalpha(static_cast<unsigned char>(rest[0])) ||
        rest[1] != '(') {
      return false;
    }
    const size_t close = rest.find(')', 2);
    if (close == std::string_view::npos ||
        rest.substr(2, close - 2).find('(') != std::string_view::npos) {
      return false;
    }
    rest.remove_prefix(close + 1);
  }
  return true;
}

// "/" and each segment of `decoded` but the empty and "." ones, with ".."
// applied; a trailing slash kept. `segment` reads a segment first (it may
// drop its parameters).
template <typename Segment>
std::string ResolveSegments(std::string_view decoded, Segment segment) {
  std::vector<std::string_view> segments;
  std::string_view rest = decoded;
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    const std::string_view seg = segment(rest.substr(0, slash));
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      if (!segments.empty()) segments.pop_back();
      continue;
    }
    segments.push_back(seg);
  }
  std::string out;
  for (std::string_view seg : segments) {
    out.push_back('/');
    out.append(seg);
  }
  const bool trailing_slash = decoded.size() > 1 && decoded.back() == '/' && !segments.empty();
  if (out.empty() || trailing_slash) out.push_back('/');
  return out;
}

}  // namespace

std::string NormalizePath(std::string_view raw) {
  if (IsNormalPath(raw)) return std::string(raw);
  std::string decoded;
  decoded.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::optional<char> c = PercentByte(raw, i);
    if (c && (absl::ascii_isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '.' ||
              *c == '_' || *c == '~')) {
      decoded.push_back(*c);
      i += 2;
      continue;
    }
    // A backslash separates segments, as IIS and ASP.NET read it.
    decoded.push_back(raw[i] == '\\' ? '/' : raw[i]);
  }
  // A segment's parameters (";jsessionid=...") are not part of it, as
  // Tomcat and Jetty map a path: "/;x/login" and "/x/..;/login" are
  // their "/login". Nor is a segment of ASP.NET's cookieless tickets
  // ("/(S(x))/login" is "/login" to IIS).
  return ResolveSegments(decoded, [](std::string_view seg) {
    seg = seg.substr(0, seg.find(';'));
    return IsCookielessTickets(seg) ? std::string_view() : seg;
  });
}

std::string PlainPath(std::string_view raw) {
  const std::optional<std::string> decoded = PercentDecode(raw);
  return ResolveSegments(decoded ? std::string_view(*decoded) : raw,
                         [](std::string_view seg) { return seg; });
}

namespace {

// The length of an http:// or https:// prefix, in any case; 0 if none.
size_t SchemeLength(std::string_view target) {
  auto starts = [&](std::string_view scheme) {
    return target.size() >= scheme.size() &&
           std::equal(scheme.begin(), scheme.end(), target.begin(), [](char a, char b) {
             return a == absl::ascii_tolower(static_cast<unsigned char>(b));
           });
  };
  if (starts("http://")) return 7;
  if (starts("https://")) return 8;
  return 0;
}

}  // namespace

std::optional<std::string_view> TargetAuthority(std::string_view target) {
  const size_t scheme = SchemeLength(target);
  if (scheme == 0) return std::nullopt;
  const std::string_view rest = target.substr(scheme);
  return rest.substr(0, rest.find_first_of("/?#"));
}

std::string_view TargetPath(std::string_view target) {
  if (const size_t scheme = SchemeLength(target); scheme != 0) {
    const size_t start = target.find_first_of("/?#", scheme);
    if (start == std::string_view::npos || target[start] != '/') return "/";
    target = target.substr(start);
  }
  return target.substr(0, std::min(target.find('?'), target.find('#')));
}

std::string_view TargetQuery(std::string_view target) {
  const size_t question = target.find('?');
  if (question == std::string_view::npos) return {};
  const std::string_view query = target.substr(question + 1);
  return query.substr(0, query.find('#'));
}

std::string_view HostName(std::string_view authority) {
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority = authority.substr(at + 1);  // user information is no part of the host
  }
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    return close == std::string_view::npos ? authority : authority.substr(0, close + 1);
  }
  std::string_view host = authority.substr(0, authority.find(':'));
  // "example.com." is the same name, fully qualified; NGINX and Apache
  // serve it as "example.com".
  if (host.size() > 1 && host.back() == '.') host.remove_suffix(1);
  return host;
}

std::optional<FlatCheck> ParseFlatCheck(std::string_view body) {
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < body.size() &&
           (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r'))
      ++i;
  };
  auto string = [&]() -> std::optional<std::string_view> {
    if (i >= body.size() || body[i] != '"') return std::nullopt;
    const size_t start = ++i;
    while (i < body.size() && body[i] != '"') {
      const auto c = static_cast<unsigned char>(body[i]);
      if (c == '\\' || c < 0x20 || c >= 0x80) return std::nullopt;  // escapes, controls, UTF-8
      ++i;
    }
    if (i >= body.size()) return std::nullopt;
    return body.substr(start, i++ - start);
  };
  FlatCheck check;
  bool seen_policy = false, seen_key = false, seen_cost = false;
  skip_ws();
  if (i >= body.size() || body[i++] != '{') return std::nullopt;
  for (;;) {
    skip_ws();
    const std::optional<std::string_view> name = string();
    if (!name) return std::nullopt;
    skip_ws();
    if (i >= body.size() || body[i++] != ':') return std::nullopt;
    skip_ws();
    if (*name == "policy" || *name == "key") {
      bool& seen = *name == "policy" ? seen_policy : seen_key;
      const std::optional<std::string_view> value = string();
      if (seen || !value) return std::nullopt;
      seen = true;
      (*name == "policy" ? check.policy : check.key) = *value;
    } else if (*name == "cost") {
      if (seen_cost) return std::nullopt;
      seen_cost = true;
      int64_t cost = 0;
      size_t digits = 0;
      while (i < body.size() && body[i] >= '0' && body[i] <= '9' && digits < 15) {
        cost = cost * 10 + (body[i++] - '0');
        ++digits;
      }
      if (digits == 0 || cost > kMaxLimit || (digits > 1 && body[i - digits] == '0'))
        return std::nullopt;
      if (i < body.size() && ((body[i] >= '0' && body[i] <= '9') || body[i] == '.' ||
                              body[i] == 'e' || body[i] == 'E')) {
        return std::nullopt;
      }
      check.cost = cost;
    } else {
      return std::nullopt;
    }
    skip_ws();
    if (i < body.size() && body[i] == ',') {
      ++i;
      continue;
    }
    if (i < body.size() && body[i] == '}') break;
    return std::nullopt;
  }
  ++i;
  skip_ws();
  if (i != body.size() || !seen_policy || !seen_key) return std::nullopt;
  return check;
}

bool JsonDepthWithin(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

bool BearerTokenIn(const std::vector<std::string>& tokens, std::string_view authorization) {
  static constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !std::equal(kScheme.begin(), kScheme.end(), authorization.begin(), [](char a, char b) {
        return a == absl::ascii_tolower(static_cast<unsigned char>(b));
      })) {
    return false;
  }
  std::string_view given = authorization.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  while (!given.empty() && given.back() == ' ') given.remove_suffix(1);
  if (given.empty()) return false;
  bool found = false;
  for (const std::string& token : tokens) {
    // Every byte of the token is compared, whatever the given value holds.
    unsigned diff = token.size() == given.size() ? 0u : 1u;
    for (size_t i = 0; i < token.size(); ++i) {
      diff |= static_cast<unsigned char>(token[i]) ^
              static_cast<unsigned char>(given[i % given.size()]);
    }
    found |= diff == 0;
  }
  return found;
}

}  // namespace sluice::policy
