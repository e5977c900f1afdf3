// Replay: an access log through the policies of a config, on the log's own
// clock. Internal to `sluice replay`.
//
// Each log line becomes the request the server would have seen: its path is
// normalized as the server normalizes it, and route matching, policy
// matching and keys (client_ip through trusted_proxies, headers, path,
// route, global) are the server's own code (server/policy_set.h). Each
// matching policy then decides with its own Limiter on a memory store, at
// the line's logged time. Policies are decided independently, as if each
// were in `shadow: true`: the report answers "what would this policy have
// limited", not how several policies would have combined.
//
// Broken lines (not the format, bad time, no request line, too long) and
// lines earlier than the latest time seen are counted, never fatal; an
// out-of-order line is decided at the latest time seen (time never goes
// back for a limiter). Memory: constant in the log's length; per policy, up
// to `max_keys` keys are tracked for the report (the limiters themselves
// are bounded by the config's store.memory.max_keys).
//
// Suggestions: for each period among a policy's limits, each key's peak,
// the most requests in any window of one period (counted in steps of a
// tenth of the period, so a window is at most a step off the true peak),
// and the quantiles of those peaks over keys. The 99.9% quantile as
// `N/period` is a limit that would have let 99.9% of keys through
// untouched by a sliding_log, fixed_window or a bucket with burst N.
//
// Thread-safety: Replay is reentrant.
//
//   absl::StatusOr<sluice::replay::ReplayReport> r = sluice::replay::Replay(config, *reader, {});
//   std::cout << sluice::replay::FormatReplayText(*r);
#ifndef SLUICE_REPLAY_REPLAY_H_
#define SLUICE_REPLAY_REPLAY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "replay/log_format.h"
#include "replay/log_reader.h"
#include "sluice/config.h"

namespace sluice::replay {

struct ReplayOptions {
  LogFormat format = LogFormat::kAuto;
  FieldMap fields;
  // Policies applied to every line, whatever their match (decision-API
  // policies have none, so they apply to no line otherwise).
  std::vector<std::string> apply;
  size_t top = 10;               // offenders listed per policy
  int64_t max_keys = 1'000'000;  // keys tracked per policy for the report
  // Called every 65536 lines and once at the end.
  std::function<void(const LineReader& reader, int64_t lines)> progress;
};

struct KeyReport {
  std::string key;
  int64_t requests = 0;
  int64_t limited = 0;
  Time first_limited;
  Time last_limited;
};

struct PeriodSuggestion {
  Duration period;
  int64_t keys = 0;                             // keys whose peaks were counted
  int64_t p50 = 0, p99 = 0, p999 = 0, max = 0;  // per-key peaks, quantiles over keys
  std::optional<int64_t> current;               // the policy's limit for this period, if it has one
  int64_t keys_over_current = 0;                // keys whose peak exceeded it
};

struct MinuteCount {
  Time minute;  // the start of a calendar minute, UTC
  int64_t limited = 0;
};

struct PolicyReport {
  std::string name;
  std::string limits;   // "token_bucket 40/s burst 40; sliding_window 300/min"
  std::string applies;  // "path_prefix /login, method POST" or "every line (--policy)"
  int64_t requests = 0;
  int64_t allowed = 0;
  int64_t limited = 0;
  int64_t delayed = 0;             // allowed with a shaping delay
  int64_t missing_key = 0;         // a key part missing and on_missing_key: deny
  int64_t key_errors = 0;          // keys the store refuses (longer than 1024 bytes)
  int64_t keys = 0;                // distinct keys tracked
  int64_t limited_keys = 0;        // of which limited at least once
  int64_t untracked_requests = 0;  // requests of keys beyond max_keys
  std::optional<Time> first_limited, last_limited;
  std::vector<MinuteCount> busiest_minutes;  // most limited first, at most 5
  std::vector<KeyReport> top;                // most limited first
  std::vector<PeriodSuggestion> suggestions;
};

struct ReplayReport {
  std::string log;
  std::string config;
  LogFormat format = LogFormat::kAuto;
  int64_t lines = 0;
  int64_t requests = 0;  // lines read as requests
  int64_t broken = 0;
  std::array<int64_t, static_cast<size_t>(LineError::kCount)> broken_by_reason{};
  std::vector<int64_t> first_broken_lines;  // up to 5 line numbers
  int64_t out_of_order = 0;
  Duration max_lateness;  // the furthest an out-of-order line lagged
  std::optional<Time> first_time, last_time;
  std::vector<PolicyReport> policies;  // those applied, in config order
  std::vector<std::string> skipped;    // policies without match and not in `apply`
  std::string input_error;             // why the input ended early (a damaged gzip), else empty
};

// Errors: InvalidArgument for an unknown policy in options.apply, and
// whatever building the policies reports. Never for the log's content.
absl::StatusOr<ReplayReport> Replay(const Config& config, LineReader& in,
                                    const ReplayOptions& options);

std::string FormatReplayText(const ReplayReport& report);
std::string FormatReplayJson(const ReplayReport& report);

}  // namespace sluice::replay

#endif  // SLUICE_REPLAY_REPLAY_H_
