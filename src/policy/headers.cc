#include "policy/headers.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/cat.h"

namespace sluice::policy {
namespace {

using internal::Append;
using internal::Cat;

// An RFC 8941 sf-string.
// Appends `s` as a structured-field string (quoted; only printable ASCII).
void AppendSfString(std::string& out, std::string_view s) {
  out.push_back('"');
  // Runs of characters that need nothing go in one append (names are
  // nearly always one run).
  size_t run = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c != '"' && c != '\\' && c >= 0x20 && c < 0x7f) continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

// The answer's policy name as an sf-string: quoted once by its policy when
// it has one (the hot path), else here.
void AppendName(std::string& out, const PolicyAnswer& a) {
  if (a.sf_name.empty()) {
    AppendSfString(out, a.name);
  } else {
    out += a.sf_name;
  }
}

// A denial that can never pass has no time to wait for (retry_after is
// Infinite); its window still resets.
int64_t SecondsUntilAvailable(const PolicyDecision& d) {
  if (!d.allowed && !d.can_never_pass()) return d.retry_after.CeilSeconds();
  return d.reset_after.CeilSeconds();
}

// Room for one policy's part of either field, so that one allocation holds
// the whole of a common answer.
constexpr size_t kFieldBytesPerPolicy = 48;

// The RateLimit-Policy field's value (RateLimitPolicyField), appended.
void AppendRateLimitPolicyValue(std::string& out, absl::Span<const PolicyAnswer> answers) {
  for (size_t i = 0; i < answers.size(); ++i) {
    const PolicyAnswer& a = answers[i];
    if (i > 0) out += ", ";
    AppendName(out, a);
    Append(out, ";q=", a.decision.limit);
    if (a.concurrent) {
      out += ";qu=\"concurrent-requests\"";
    } else {
      Append(out, ";w=", a.window_seconds);
    }
  }
}

// The RateLimit field's value (RateLimitField), appended.
void AppendRateLimitValue(std::string& out, absl::Span<const PolicyAnswer> answers) {
  for (size_t i = 0; i < answers.size(); ++i) {
    const PolicyAnswer& a = answers[i];
    if (i > 0) out += ", ";
    AppendName(out, a);
    Append(out, ";r=", std::max<int64_t>(0, a.decision.remaining));
    if (!a.decision.can_never_pass()) Append(out, ";t=", SecondsUntilAvailable(a.decision));
  }
}

}  // namespace

std::string RateLimitPolicyField(absl::Span<const PolicyAnswer> answers) {
  std::string out;
  out.reserve(kFieldBytesPerPolicy * answers.size());
  AppendRateLimitPolicyValue(out, answers);
  return out;
}

std::string RateLimitField(absl::Span<const PolicyAnswer> answers) {
  std::string out;
  out.reserve(kFieldBytesPerPolicy * answers.size());
  AppendRateLimitValue(out, answers);
  return out;
}

std::string SfString(std::string_view s) {
  std::string out;
  AppendSfString(out, s);
  return out;
}

int64_t RetryAfterSeconds(Duration exact, Duration jitter, std::mt19937_64& rng) {
  int64_t extra = 0;
  if (jitter > Duration::Zero()) {
    extra = std::uniform_int_distribution<int64_t>(0, jitter.micros())(rng);
  }
  return (exact + Duration::Micros(extra)).CeilSeconds();
}

namespace {

// Whether one of the eight bytes of `w` needs an escape in a JSON string:
// a control character (below 0x20), '"' or '\'. Bytes from 0x80 (UTF-8)
// need none. below(x, n) is nonzero exactly when a byte of x is below n
// (n <= 128): with no such byte nothing borrows, and a top bit that x - n
// sets is one x had set already; the lowest such byte sets its top bit,
// which x had clear.
constexpr bool NeedsJsonEscape(uint64_t w) {
  constexpr uint64_t kOnes = 0x0101010101010101, kTops = 0x8080808080808080;
  const auto below = [](uint64_t x, uint64_t n) { return (x - kOnes * n) & ~x & kTops; };
  return (below(w, 0x20) | below(w ^ (kOnes * '"'), 1) | below(w ^ (kOnes * '\\'), 1)) != 0;
}

}  // namespace

void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  // Eight bytes at a time while none needs an escape (nearly every text is
  // one run); from the first that may, byte by byte.
  size_t i = 0;
  for (uint64_t w; i + 8 <= s.size(); i += 8) {
    std::memcpy(&w, s.data() + i, 8);
    if (NeedsJsonEscape(w)) break;
  }
  // Runs of characters that need no escape (UTF-8 among them: it passes
  // through unchanged) go in one append.
  size_t run = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (c != '"' && c != '\\' && u >= 0x20) continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    if (u < 0x20) {
      out += "\\u00";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    } else {
      out.push_back('\\');
      out.push_back(c);
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

// Written by hand rather than through a JSON tree: this is every denial's
// body, on the hot path.
std::string ProblemBody(int status, const std::vector<std::string>& violated,
                        std::string_view detail) {
  static constexpr std::string_view kHead =
      "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\","
      "\"title\":\"quota-exceeded\",\"status\":";
  // One allocation where nothing needs an escape: the head, the status, the
  // texts with their quotes and commas, and the tail.
  size_t size = kHead.size() + 64 + detail.size();
  for (const std::string& name : violated) size += name.size() + 3;
  std::string out;
  out.reserve(size);
  out += kHead;
  Append(out, status, ",\"detail\":");
  AppendJsonString(out, detail);
  out += ",\"violated-policies\":[";
  for (size_t i = 0; i < violated.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(out, violated[i]);
  }
  out += "]}";
  return out;
}

std::string ErrorBody(int status, std::string_view title, std::string_view detail) {
  std::string out = "{\"type\":\"about:blank\",\"title\":";
  AppendJsonString(out, title);
  out += Cat(",\"status\":", status, ",\"detail\":");
  AppendJsonString(out, detail);
  out.push_back('}');
  return out;
}

void AppendRateLimitHeaders(absl::Span<const PolicyAnswer> answers, bool legacy, FieldList& out) {
  if (answers.empty()) return;
  // Both fields' names and CRLFs, and their values, in one allocation.
  out.Reserve(2 * kFieldBytesPerPolicy * answers.size() + 48 + (legacy ? 80 : 0));
  AppendRateLimitPolicyValue(out.Open("RateLimit-Policy"), answers);
  out.Close();
  AppendRateLimitValue(out.Open("RateLimit"), answers);
  out.Close();
  if (legacy) {
    // The legacy trio has room for one policy: the most restrictive.
    const PolicyAnswer* worst = &answers.front();
    for (const PolicyAnswer& a : answers) {
      if (!a.decision.allowed && worst->decision.allowed)
        worst = &a;
      else if (a.decision.allowed == worst->decision.allowed &&
               a.decision.remaining < worst->decision.remaining)
        worst = &a;
    }
    out.Add("X-RateLimit-Limit", worst->decision.limit);
    out.Add("X-RateLimit-Remaining", std::max<int64_t>(0, worst->decision.remaining));
    out.Add("X-RateLimit-Reset", SecondsUntilAvailable(worst->decision));
  }
}

}  // namespace sluice::policy
