// Seeded request traces for the conformance tests.
//
// Every trace is a list of (time, cost) requests produced from a fixed seed by
// a generator that does not depend on the standard library's distributions
// (whose output differs between implementations): the same seed gives the
// same trace everywhere, so measured numbers printed by the tests are
// reproducible.
#ifndef SLUICE_TESTS_CONFORMANCE_TRACE_H_
#define SLUICE_TESTS_CONFORMANCE_TRACE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sluice/rate.h"
#include "sluice/time.h"

namespace sluice::conformance {

// 2024-01-01T00:00:00Z: traces start near here (a calendar boundary).
inline constexpr Time kTraceOrigin = Time::FromUnixMicros(1'704'067'200'000'000);
// 2070-01-01T00:00:00Z: the far end of the time line the tests use.
inline constexpr Time kYear2070 = Time::FromUnixMicros(3'155'760'000'000'000);
// One second after the epoch: the far past a clock can step back to.
inline constexpr Time kNearEpoch = Time::FromUnixMicros(1'000'000);

struct Request {
  Time at;
  int64_t cost = 1;
};

// mt19937_64 plus portable uniform / exponential draws.
class TraceRng {
 public:
  explicit TraceRng(uint64_t seed) : engine_(seed) {}

  // Uniform in [lo, hi] (hi >= lo).
  int64_t Uniform(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    if (span == 0) return static_cast<int64_t>(engine_());  // the whole range
    return lo + static_cast<int64_t>(engine_() % span);
  }
  // Uniform in [0, 1).
  double Unit() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  bool Chance(double p) { return Unit() < p; }
  // Exponentially distributed with the given mean, rounded to whole units.
  int64_t Exponential(double mean) {
    const double x = -std::log1p(-Unit()) * mean;
    return x >= 9e18 ? int64_t{9'000'000'000'000'000'000} : static_cast<int64_t>(std::llround(x));
  }

 private:
  std::mt19937_64 engine_;
};

struct TraceOptions {
  // Sets the time scale: the mean gap is period / limit / load.
  Rate rate{1, Duration::Seconds(1)};
  // The largest cost the algorithm can ever admit.
  int64_t capacity = 1;
  int steps = 1000;
  // Offered cost per unit of rate (at cost 1 per request).
  double load = 1.5;
  // Occasionally step the clock backwards.
  bool steps_back = false;
  // The first request is at `start` plus a random offset below one period
  // (unless exact_start).
  Time start = kTraceOrigin;
  bool exact_start = false;
};

// A cost drawn as the brief asks: mostly 0..3, sometimes exactly the
// capacity, sometimes above it.
inline int64_t NextCost(TraceRng& rng, int64_t capacity) {
  const int64_t r = rng.Uniform(0, 99);
  if (r < 10) return 0;
  if (r < 65) return 1;
  if (r < 78) return 2;
  if (r < 88) return 3;
  if (r < 92) return capacity;
  if (r < 96) return capacity + rng.Uniform(1, 3);
  return rng.Uniform(1, std::max<int64_t>(1, std::min<int64_t>(capacity, 1'000'000)));
}

// The time of the next request after `now`.
inline int64_t NextTime(TraceRng& rng, int64_t now, const TraceOptions& options) {
  const int64_t period = options.rate.period.micros();
  const double mean_gap =
      static_cast<double>(period) / static_cast<double>(options.rate.limit) / options.load;
  const int64_t r = rng.Uniform(0, 99);
  if (r < 55) return now + rng.Exponential(mean_gap);
  if (r < 67) return now;  // same instant
  if (r < 72) return now + 1;
  if (r < 77) return now + rng.Uniform(period, 3 * period);  // idle
  if (r < 85) {
    // Right around the next calendar-aligned period boundary.
    const int64_t next_boundary = (now / period + 1) * period;
    return std::max(now, next_boundary + rng.Uniform(-2, 2));
  }
  if (r < 90 && options.steps_back) {
    return now - (rng.Chance(0.5) ? rng.Uniform(1, 3) : rng.Uniform(1, 2 * period));
  }
  return now + rng.Exponential(mean_gap * 5);
}

// A random trace over the time scale of `options.rate`: Poisson-like
// arrivals, bursts at one instant, 1us steps, idle gaps of periods, requests
// straddling period boundaries, and (if asked) steps back in time.
inline std::vector<Request> RandomTrace(uint64_t seed, const TraceOptions& options) {
  TraceRng rng(seed);
  std::vector<Request> trace;
  trace.reserve(options.steps);
  int64_t now = options.start.unix_micros();
  if (!options.exact_start) now += rng.Uniform(0, options.rate.period.micros() - 1);
  for (int i = 0; i < options.steps; ++i) {
    if (i > 0) now = NextTime(rng, now, options);
    trace.push_back({Time::FromUnixMicros(now), NextCost(rng, options.capacity)});
  }
  return trace;
}

// Unit-cost Poisson arrivals at `load` times the rate.
inline std::vector<Request> PoissonTrace(uint64_t seed, const Rate& rate, double load, int steps,
                                         Time start = kTraceOrigin) {
  TraceRng rng(seed);
  const double mean_gap =
      static_cast<double>(rate.period.micros()) / static_cast<double>(rate.limit) / load;
  std::vector<Request> trace;
  trace.reserve(steps);
  int64_t now = start.unix_micros();
  for (int i = 0; i < steps; ++i) {
    now += rng.Exponential(mean_gap);
    trace.push_back({Time::FromUnixMicros(now), 1});
  }
  return trace;
}

// Unit-cost bursts: bursts of 1..2*limit requests packed into a tenth of a
// period, separated by exponential gaps with a mean of `mean_gap_periods`
// periods.
inline std::vector<Request> BurstyTrace(uint64_t seed, const Rate& rate, double mean_gap_periods,
                                        int steps, Time start = kTraceOrigin) {
  TraceRng rng(seed);
  const int64_t period = rate.period.micros();
  std::vector<Request> trace;
  trace.reserve(steps);
  int64_t now = start.unix_micros();
  while (static_cast<int>(trace.size()) < steps) {
    now += rng.Exponential(mean_gap_periods * static_cast<double>(period));
    const int64_t size = rng.Uniform(1, 2 * rate.limit);
    const int64_t span = rng.Uniform(0, period / 10);
    for (int64_t k = 0; k < size && static_cast<int>(trace.size()) < steps; ++k) {
      trace.push_back({Time::FromUnixMicros(now + span * k / size), 1});
    }
    now += span;
  }
  return trace;
}

}  // namespace sluice::conformance

#endif  // SLUICE_TESTS_CONFORMANCE_TRACE_H_
