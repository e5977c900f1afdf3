#include "server/request_text.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "sluice/rate.h"

namespace sluice::server {

std::optional<char> PercentByte(std::string_view s, size_t i) {
  if (s[i] != '%' || i + 2 >= s.size()) return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<char>(hi * 16 + lo);
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

std::string NormalizePath(std::string_view raw) {
  std::string decoded;
  decoded.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::optional<char> c = PercentByte(raw, i);
    if (c && (std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '.' ||
              *c == '_' || *c == '~')) {
      decoded.push_back(*c);
      i += 2;
      continue;
    }
    decoded.push_back(raw[i]);
  }
  std::vector<std::string_view> segments;
  std::string_view rest = decoded;
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    const std::string_view seg = rest.substr(0, slash);
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

std::string_view TargetPath(std::string_view target) {
  if (target.substr(0, 7) == "http://" || target.substr(0, 8) == "https://") {
    const size_t authority = target.find("//") + 2;
    const size_t slash = target.find('/', authority);
    if (slash == std::string_view::npos) return "/";
    target = target.substr(slash);
  }
  return target.substr(0, std::min(target.find('?'), target.find('#')));
}

std::optional<FlatCheck> ParseFlatCheck(std::string_view body) {
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < body.size() && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) ++i;
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
      if (digits == 0 || cost > kMaxLimit || (digits > 1 && body[i - digits] == '0')) return std::nullopt;
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

}  // namespace sluice::server
