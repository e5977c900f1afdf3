// What a client is told: the draft-10 RateLimit fields, Retry-After with
// jitter, legacy X-RateLimit-*, and the problem+json body of a denial.
// Internal; pure functions.
#ifndef SLUICE_POLICY_HEADERS_H_
#define SLUICE_POLICY_HEADERS_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "policy/field_list.h"
#include "sluice/limiter.h"

namespace sluice::policy {

// One policy's part in the answer to a request.
struct PolicyAnswer {
  std::string_view name;     // the policy's, which outlives the answer
  std::string_view sf_name;  // `name` as an sf-string when known (SfString), else empty
  PolicyDecision decision;
  int64_t window_seconds = 1;  // w= of the deciding limit
  bool concurrent = false;     // a concurrency limit: qu="concurrent-requests", no w=
  bool shadow = false;         // decided, counted, never enforced
};

// `"login";q=40;w=60, "api";q=20;w=1`; a concurrency limit's answer:
// `"upstream";q=10;qu="concurrent-requests"`.
std::string RateLimitPolicyField(absl::Span<const PolicyAnswer> answers);
// `"login";r=0;t=17`: t is the wait until the request could pass when
// denied (never later than Retry-After), else the time until a full reset.
std::string RateLimitField(absl::Span<const PolicyAnswer> answers);

// `s` as an RFC 8941 sf-string: quoted, '"' and '\\' escaped, bytes that
// are not printable ASCII dropped.
std::string SfString(std::string_view s);

// Whole seconds, never earlier than `exact`: ceil(exact + uniform[0, jitter]).
int64_t RetryAfterSeconds(Duration exact, Duration jitter, std::mt19937_64& rng);

// Appends `s` as a JSON string literal (quotes, escapes).
void AppendJsonString(std::string& out, std::string_view s);

// The RFC 9457 body of a denial (type quota-exceeded, violated-policies).
std::string ProblemBody(int status, const std::vector<std::string>& violated,
                        std::string_view detail);
// A plain error as problem+json (bad request, unknown policy, ...).
std::string ErrorBody(int status, std::string_view title, std::string_view detail);

// Appends the RateLimit fields (and legacy ones when asked).
void AppendRateLimitHeaders(absl::Span<const PolicyAnswer> answers, bool legacy, FieldList& out);

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_HEADERS_H_
