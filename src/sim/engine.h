// The simulator: a discrete-event run of a Scenario on a manual clock.
// Internal.
//
// Every decision is made by the library's own code: a setup with one limit
// calls that algorithm's pure Decide (the function the memory store runs
// under its lock) on state kept per (instance, key); a setup with several
// limits goes through sluice::Limiter on a MemoryStore, all-or-nothing as in
// a policy. There is no second implementation of any algorithm here; the
// engine only moves requests in time: arrivals, Retry-After and backoff
// waits, shaping delays and the downstream's queue.
//
// Deterministic: the same scenario and seed give the same result, bit for
// bit (see random.h). Events at the same microsecond run in the order they
// were scheduled.
//
// Thread-safety: Simulate is reentrant; results are plain values.
//
//   absl::StatusOr<sluice::sim::Result> r = sluice::sim::Simulate(scenario, /*seed=*/1);
//   for (const auto& run : r->runs) std::cout << run.name << " " << run.admitted << "\n";
#ifndef SLUICE_SIM_ENGINE_H_
#define SLUICE_SIM_ENGINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/scenario.h"

namespace sluice::sim {

// Counts per time bucket, for plots and for the tests' view of the shape.
struct Series {
  Duration bucket = Duration::Seconds(1);
  std::vector<int64_t> offered;   // attempts (first tries and retries) arriving
  std::vector<int64_t> admitted;  // leaving the limiter (after any shaping delay)
  std::vector<int64_t> rejected;
  std::vector<int64_t> retries;  // the retries among `offered`
};

struct Percentiles {
  Duration p50, p90, p99, max;
};

// One limiter setup's run.
struct LimiterRun {
  std::string name;
  std::string limits;  // "token_bucket 40/s burst 40; sliding_window 300/min"
  Rate contract;       // what max_admitted_period is measured against

  int64_t requests = 0;  // first tries: what the clients wanted
  int64_t offered = 0;   // first tries + retries
  int64_t retries = 0;
  int64_t admitted = 0;
  int64_t rejected = 0;
  int64_t delayed = 0;     // admitted with a shaping delay > 0
  int64_t served = 0;      // requests eventually admitted (and not dropped downstream)
  int64_t gave_up = 0;     // requests never admitted: no retry left, or can never pass
  int64_t unfinished = 0;  // still waiting to retry when the scenario ended
  int64_t dropped = 0;     // admitted, then refused by a full downstream queue

  int64_t max_admitted_1s = 0;      // all keys, any rolling second
  int64_t max_admitted_period = 0;  // the worst key, any rolling contract period
  // Coefficient of variation of admitted per second, from the first
  // admission's second to the last's: 0 is a perfectly even stream.
  double admitted_cv = 0;
  Percentiles delay;                  // shaping delay over all admitted requests
  Percentiles latency;                // first try to completion, over served requests
  std::optional<Duration> served_by;  // the last completion, from the start
  int64_t peak_arrivals_1s = 0;       // most attempts in one 1 s bucket
  int64_t peak_retries_1s = 0;
  Duration retry_wave;       // from the first retry's arrival to the last's
  int64_t peak_backlog = 0;  // downstream: most requests in it at once
  Duration max_queue_wait;   // downstream: longest wait before service
  // Most requests of one key in flight at once (admitted, not yet done by
  // the downstream or their service time): what a concurrency limit bounds.
  int64_t peak_in_flight = 0;

  Series series;
};

struct Result {
  std::string scenario;
  std::string description;
  uint64_t seed = 1;
  Duration duration;
  int64_t instances = 1;
  std::optional<Downstream> downstream;
  std::optional<ServiceTime> service_time;
  std::vector<LimiterRun> runs;  // in the scenario's limiter order
};

// Errors: InvalidArgument for a scenario that is out of bounds (see
// scenario.h) or whose limits MakeLimit rejects; ResourceExhausted when a run
// passes kMaxAttempts.
absl::StatusOr<Result> Simulate(const Scenario& scenario, uint64_t seed);

// One limiter setup of the scenario, by index.
absl::StatusOr<LimiterRun> SimulateRun(const Scenario& scenario, size_t limiter, uint64_t seed);

}  // namespace sluice::sim

#endif  // SLUICE_SIM_ENGINE_H_
