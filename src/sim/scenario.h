// Scenario: a simulated deployment, as plain structs. Internal to the
// simulator.
//
// Clients (in groups, each with an arrival pattern and a retry policy) send
// requests to one or more limiter instances, which pass what they admit to a
// downstream of a given capacity. Each entry of `limiters` is one run of the
// same offered traffic against a different limiter setup: the comparison
// `sluice sim` prints and plots. Scenario files (scenario_file.h) and the
// built-in scenarios (builtin.h) both produce this struct; docs/simulator.md
// documents every field.
//
// All times are offsets from the start of the simulation; `clock_start` puts
// that start on the calendar, which matters to fixed_window and
// sliding_window (their windows start at multiples of the period since the
// Unix epoch).
//
//   sluice::sim::Scenario s{.name = "mine", .duration = sluice::Duration::Minutes(5)};
//   s.groups.push_back({.name = "users", .clients = 100, ...});
#ifndef SLUICE_SIM_SCENARIO_H_
#define SLUICE_SIM_SCENARIO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/algorithm.h"
#include "sluice/rate.h"
#include "sluice/time.h"

namespace sluice::sim {

// Limits that keep one run's memory and time bounded (errors beyond them).
inline constexpr Duration kMaxDuration = Duration::Days(2);
inline constexpr int64_t kMaxClients = 10'000'000;
inline constexpr int64_t kMaxInstances = 1024;
inline constexpr int64_t kMaxAttempts = 200'000'000;  // requests + retries, per limiter

enum class ArrivalKind {
  kBurst,     // `count` requests at `at`, spread evenly over `spread`
  kConstant,  // evenly spaced at `rate` over [from, until)
  kPoisson,   // a Poisson process of `rate` over [from, until)
  kDiurnal,   // a Poisson process whose rate swings between `low` and `rate`
};

struct Arrival {
  ArrivalKind kind = ArrivalKind::kBurst;
  Duration from;      // burst: when it starts
  Duration until;     // not burst: end, exclusive (the scenario's duration if unset)
  int64_t count = 0;  // burst
  Duration spread;    // burst: 0 is one instant
  Rate rate;          // the group's total rate; diurnal: the peak rate
  Rate low;           // diurnal: the trough rate
  Duration peak_at;   // diurnal: when the rate peaks (within the cycle)
  Duration cycle = Duration::Days(1);  // diurnal: length of one swing
};

enum class RetryKind {
  kNever,       // a rejected request is given up
  kFixed,       // retry after `delay` (+ uniform [0, jitter])
  kRetryAfter,  // retry when Retry-After says (+ uniform [0, jitter] of the client's own)
  kBackoff,     // exponential backoff with full jitter: uniform [0, min(cap, base * 2^(n-1))]
};

struct RetryPolicy {
  RetryKind kind = RetryKind::kNever;
  Duration delay;                        // fixed
  Duration jitter;                       // fixed, retry_after
  Duration base = Duration::Seconds(1);  // backoff
  Duration cap = Duration::Minutes(1);   // backoff
  int64_t max_attempts = 0;  // the first try included; 0: until admitted or the scenario ends
};

enum class KeyMode {
  kClient,  // each client its own key ("users-17")
  kGroup,   // one key for the whole group ("users")
  kGlobal,  // one key for every group that says global ("*")
};

struct ClientGroup {
  std::string name;
  int64_t clients = 1;
  KeyMode key = KeyMode::kClient;
  RetryPolicy retry;
  std::vector<Arrival> traffic;
};

enum class StateScope {
  kLocal,   // `scope: local`: each instance keeps its own state (a memory store per process)
  kShared,  // `scope: global`: one state for all instances (a shared store such as Redis)
};

struct LimiterSetup {
  std::string name;                  // the label in tables and plots
  std::vector<LimitOptions> limits;  // one or more, all-or-nothing as in a policy
  StateScope scope = StateScope::kLocal;
  // Spread added to Retry-After, as `on_deny.retry_after_jitter` in a
  // policy. Unset: a tenth of the denying limit's period, sluice serve's
  // default.
  std::optional<Duration> retry_after_jitter;
  // Replaces every group's retry policy for this run (to compare retry
  // behaviours against one limit).
  std::optional<RetryPolicy> retry;
};

struct Downstream {
  Rate capacity;      // requests it completes per period, one at a time, in order
  int64_t queue = 0;  // most requests waiting; beyond, dropped. 0: unbounded
};

// How long an admitted request is in flight when there is no downstream:
// what a concurrency limit's slots are held for.
struct ServiceTime {
  enum class Kind { kConstant, kExponential, kUniform };
  Kind kind = Kind::kConstant;
  Duration a;  // the time, the mean, or the low end
  Duration b;  // kUniform: the high end
};
inline constexpr Duration kMaxServiceTime = Duration::Hours(1);

enum class Balance {
  kRoundRobin,  // request n goes to instance n mod instances
  kSticky,      // a client always reaches the same instance
};

struct Scenario {
  std::string name;
  std::string description;
  Duration duration = Duration::Minutes(1);
  Duration clock_start;  // the simulation's start, from the Unix epoch
  uint64_t seed = 1;
  int64_t instances = 1;
  Balance balance = Balance::kRoundRobin;
  std::optional<Downstream> downstream;
  // An admitted request is in flight until the downstream completes it, or
  // for its service time; without either, it completes at once (and a
  // concurrency limit, which nothing would release, is refused).
  std::optional<ServiceTime> service_time;
  // The contract "most admitted per period" is checked against. Unset: each
  // limiter's first limit.
  std::optional<Rate> contract;
  std::vector<ClientGroup> groups;
  std::vector<LimiterSetup> limiters;
  // Requests and retries per limiter before a run stops with
  // ResourceExhausted (not read from files: the admin listener's
  // simulations set a lower one).
  int64_t max_attempts = kMaxAttempts;
  // What the file says in a way that still reads but is on its way out
  // ("storm.yaml:12: limiters[1].scope: ..."), for the caller to print.
  std::vector<std::string> warnings;
};

}  // namespace sluice::sim

#endif  // SLUICE_SIM_SCENARIO_H_
