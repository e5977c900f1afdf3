// sluice/envoy_config.h: rate limit rules in envoyproxy/ratelimit's YAML
// format, as plain structs.
//
// The format is envoyproxy/ratelimit's (one domain, nested descriptors with
// key/value, rate_limit with unit and requests_per_unit, unlimited,
// shadow_mode, replaces, name, trailing-`*` wildcard values). sluice adds the
// keys of its own limits inside `rate_limit`: `algorithm` (default
// fixed_window, what envoyproxy/ratelimit does), `rate` or `limit` +
// `period` (any window, e.g. 10/5s) instead of unit + requests_per_unit,
// `burst` and `scope`. docs/envoy.md documents every key. Keys that
// envoyproxy/ratelimit knows and sluice does not implement are errors that
// name them, like unknown keys: a rule is never silently weakened.
//
// Errors read "<file>:<line>: <path>: <message>", as for the main config
// (sluice/config.h), with the path counted inside the envoy file
// ("descriptors[1].rate_limit.unit") or, inline, from the top of the main
// config ("envoy[0].descriptors[1].rate_limit.unit").
//
// Thread-safety: plain values; the parsers are reentrant.
//
//   absl::StatusOr<sluice::EnvoyDomain> d = sluice::LoadEnvoyFile("ratelimit/edge.yaml");
//   if (!d.ok()) { std::cerr << d.status().message(); return 2; }
//   for (const sluice::EnvoyDescriptor& rule : d->descriptors) { ... }
#ifndef SLUICE_ENVOY_CONFIG_H_
#define SLUICE_ENVOY_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/config.h"

namespace sluice {

// The time units of the Envoy API. The numbers are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
enum class EnvoyUnit {
  kUnknown = 0,
  kSecond = 1,
  kMinute = 2,
  kHour = 3,
  kDay = 4,
  kMonth = 5,
  kYear = 6,
  kWeek = 7
};

// The unit's length as envoyproxy/ratelimit counts it (a month is 30 days,
// a year 365); windows are aligned to multiples of it since the Unix epoch.
// Zero for kUnknown.
Duration EnvoyUnitLength(EnvoyUnit unit);
// "second", "minute", ...; "unknown".
std::string_view EnvoyUnitName(EnvoyUnit unit);

struct EnvoyRateLimit {
  // unlimited: true. Matching requests are never limited and no state is kept.
  bool unlimited = false;
  // requests_per_unit: 0. Matching requests are always over the limit.
  bool deny_all = false;
  // What DescriptorStatus.current_limit reports. With `rate:`, the unit is
  // the one whose length equals the period, else kUnknown.
  EnvoyUnit unit = EnvoyUnit::kUnknown;
  uint32_t requests_per_unit = 0;
  // `name` (may be empty) and the names listed in `replaces`.
  std::string name;
  std::vector<std::string> replaces;
  // The sluice limit it maps to; meaningful unless unlimited or deny_all.
  // Default: fixed_window, requests_per_unit per unit.
  LimitSpec limit;
  friend bool operator==(const EnvoyRateLimit&, const EnvoyRateLimit&) = default;
};

struct EnvoyDescriptor {
  std::string key;
  // Absent: matches any value, and each value gets its own state. A value
  // ending in `*` matches the values that start with what precedes it.
  std::optional<std::string> value;
  std::optional<EnvoyRateLimit> rate_limit;
  bool shadow_mode = false;      // decide and count, always answer OK
  bool detailed_metric = false;  // accepted; see docs/envoy.md
  // With a wildcard value: every value it matches shares one state (the
  // state key holds the pattern, not the value).
  bool share_threshold = false;
  std::vector<EnvoyDescriptor> descriptors;
  int line = 0;  // where it starts in `source` of its domain
  friend bool operator==(const EnvoyDescriptor&, const EnvoyDescriptor&) = default;
};

struct EnvoyDomain {
  std::string domain;
  std::vector<EnvoyDescriptor> descriptors;
  std::string source;  // the file it was read from ("<string>" for text)
  int line = 0;
  // Keys read and not acted on ("file:line: path: ignored: why"), for the
  // operator: printed by --check and logged at start and on reload.
  std::vector<std::string> warnings;
  friend bool operator==(const EnvoyDomain&, const EnvoyDomain&) = default;
};

// The names of envoyproxy/ratelimit's three limit headers (its
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER; for the
// request, LIMIT_REQUEST_*_HEADER), its defaults by default.
struct EnvoyLimitHeaders {
  std::string limit = "RateLimit-Limit";
  std::string remaining = "RateLimit-Remaining";
  std::string reset = "RateLimit-Reset";
  friend bool operator==(const EnvoyLimitHeaders&, const EnvoyLimitHeaders&) = default;
};

// Config::envoy: the domains of `envoy:` (inline) then of `envoy_files:`, in
// order; no domain appears twice (with envoy_merge_domains, its later
// appearances' descriptors are added to the first).
struct EnvoyConfig {
  std::vector<EnvoyDomain> domains;
  // envoy_shadow_mode (envoyproxy/ratelimit's SHADOW_MODE): every rule as if
  // it had shadow_mode, and a call OVER_LIMIT by a limit the request itself
  // gave answered OK.
  bool shadow_mode = false;
  // envoy_limit_headers (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED
  // and LIMIT_REQUEST_HEADERS_ENABLED): the limit, remaining and reset of the
  // descriptor nearest its limit (the last one over it, on OVER_LIMIT), in
  // response_headers_to_add and request_headers_to_add, beside sluice's own
  // RateLimit fields.
  std::optional<EnvoyLimitHeaders> response_limit_headers;
  std::optional<EnvoyLimitHeaders> request_limit_headers;
};

struct EnvoyParseOptions {
  // A shared store (store.redis) is configured: `scope` defaults to global
  // and may be global.
  bool shared_store = false;
  // envoy_merge_domains (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIGS): a
  // domain met again adds its descriptors to the first one's.
  bool merge_domains = false;
};

// One envoyproxy/ratelimit config file's text. `source` names it in errors.
absl::StatusOr<EnvoyDomain> ParseEnvoyDomain(std::string_view yaml, const std::string& source,
                                             EnvoyParseOptions options = {});
// The same, read from `path` (at most 16 MiB).
absl::StatusOr<EnvoyDomain> LoadEnvoyFile(const std::string& path, EnvoyParseOptions options = {});

}  // namespace sluice

#endif  // SLUICE_ENVOY_CONFIG_H_
