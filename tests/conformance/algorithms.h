// One interface over the seven algorithm configs, for tests that state a rule
// for all of them, and the list of configs the conformance suite runs.
//
// `Algo<Config>` gives each algorithm the same shape: Step (decide and keep
// the new state), Copy, GiveBack (refund), FreshTime, SameState and Capacity
// (the largest cost it can ever admit). sliding_log's state is updated in
// place and is not copyable; Copy rebuilds it entry by entry.
#ifndef SLUICE_TESTS_CONFORMANCE_ALGORITHMS_H_
#define SLUICE_TESTS_CONFORMANCE_ALGORITHMS_H_

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "conformance/trace.h"
#include "gtest/gtest.h"
#include "sluice/algorithm.h"
#include "sluice/decision.h"
#include "sluice/rate.h"
#include "sluice/time.h"

namespace sluice {

// gtest prints Decisions with this (found by ADL).
inline void PrintTo(const Decision& d, std::ostream* os) {
  *os << "{allowed=" << d.allowed << " limit=" << d.limit << " remaining=" << d.remaining
      << " reset_after=" << d.reset_after.micros() << "us retry_after="
      << (d.retry_after.IsInfinite() ? std::string("inf")
                                     : std::to_string(d.retry_after.micros()) + "us")
      << " delay=" << d.delay.micros() << "us}";
}

}  // namespace sluice

namespace sluice::conformance {

inline std::string DebugString(const Decision& d) {
  std::ostringstream os;
  PrintTo(d, &os);
  return os.str();
}

// Every field equal.
inline testing::AssertionResult SameDecision(const Decision& got, const Decision& want) {
  if (got.allowed == want.allowed && got.limit == want.limit && got.remaining == want.remaining &&
      got.reset_after == want.reset_after && got.retry_after == want.retry_after &&
      got.delay == want.delay) {
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure()
         << "got " << DebugString(got) << "\n want " << DebugString(want);
}

inline std::string TimeString(Time t) { return std::to_string(t.unix_micros()) + "us"; }

// ---- Algo<Config> ----

template <typename Config>
struct Algo;

// The algorithms whose state is a plain value returned in an Outcome.
template <typename ConfigT, typename StateT>
struct ValueAlgo {
  using Config = ConfigT;
  using State = StateT;
  static constexpr bool kValueState = true;

  static Decision Step(const Config& config, State& state, Time now, int64_t cost) {
    Outcome<State> outcome = Decide(config, state, now, cost);
    state = outcome.state;
    return outcome.decision;
  }
  static State Copy(const State& state) { return state; }
  static void GiveBack(const Config& config, State& state, Time taken_at, int64_t cost) {
    state = Refund(config, state, taken_at, cost);
  }
  static Time FreshTime(const Config& config, const State& state) { return FreshAt(config, state); }
};

template <>
struct Algo<TokenBucketConfig> : ValueAlgo<TokenBucketConfig, TokenBucketState> {
  static constexpr std::string_view kName = "token_bucket";
  static int64_t Capacity(const Config& config) { return config.burst(); }
  static bool SameState(const State& a, const State& b) {
    return a.tokens_ticks == b.tokens_ticks && a.last_us == b.last_us;
  }
};

template <>
struct Algo<GcraConfig> : ValueAlgo<GcraConfig, GcraState> {
  static constexpr std::string_view kName = "gcra";
  static int64_t Capacity(const Config& config) { return config.burst(); }
  static bool SameState(const State& a, const State& b) { return a.tat_ticks == b.tat_ticks; }
};

template <>
struct Algo<LeakyPoliceConfig> : ValueAlgo<LeakyPoliceConfig, LeakyPoliceState> {
  static constexpr std::string_view kName = "leaky_bucket_police";
  static int64_t Capacity(const Config& config) { return config.burst(); }
  static bool SameState(const State& a, const State& b) {
    return a.level_ticks == b.level_ticks && a.last_us == b.last_us;
  }
};

template <>
struct Algo<LeakyShapeConfig> : ValueAlgo<LeakyShapeConfig, LeakyShapeState> {
  static constexpr std::string_view kName = "leaky_bucket_shape";
  static int64_t Capacity(const Config& config) { return config.capacity(); }
  static bool SameState(const State& a, const State& b) {
    return a.next_free_ticks == b.next_free_ticks;
  }
};

template <>
struct Algo<FixedWindowConfig> : ValueAlgo<FixedWindowConfig, FixedWindowState> {
  static constexpr std::string_view kName = "fixed_window";
  static int64_t Capacity(const Config& config) { return config.limit(); }
  static bool SameState(const State& a, const State& b) {
    return a.window == b.window && a.count == b.count;
  }
};

template <>
struct Algo<SlidingWindowConfig> : ValueAlgo<SlidingWindowConfig, SlidingWindowState> {
  static constexpr std::string_view kName = "sliding_window";
  static int64_t Capacity(const Config& config) { return config.limit(); }
  static bool SameState(const State& a, const State& b) {
    return a.window == b.window && a.prev == b.prev && a.curr == b.curr;
  }
};

template <>
struct Algo<SlidingLogConfig> {
  using Config = SlidingLogConfig;
  using State = SlidingLogState;
  static constexpr std::string_view kName = "sliding_log";
  // Decide updates the state in place, and even a peek or a denial moves the
  // log's clock and drops expired entries: "unchanged" is checked by behaviour.
  static constexpr bool kValueState = false;

  static Decision Step(const Config& config, State& state, Time now, int64_t cost) {
    return Decide(config, state, now, cost);
  }
  static State Copy(const State& state) {
    State copy;
    for (int64_t i = 0; i < state.size(); ++i) {
      copy.Push(state.at(i).time_us, state.at(i).cost, INT64_MAX, state.name_at(i));
    }
    copy.SeeTime(state.last_time_us());
    return copy;
  }
  static void GiveBack(const Config& config, State& state, Time taken_at, int64_t cost) {
    Refund(config, state, taken_at, cost);
  }
  static Time FreshTime(const Config& config, const State& state) { return FreshAt(config, state); }
  static int64_t Capacity(const Config& config) { return config.limit(); }
  static bool SameState(const State& a, const State& b) {
    if (a.size() != b.size() || a.last_time_us() != b.last_time_us()) return false;
    for (int64_t i = 0; i < a.size(); ++i) {
      if (a.at(i).time_us != b.at(i).time_us || a.at(i).cost != b.at(i).cost ||
          a.name_at(i) != b.name_at(i)) {
        return false;
      }
    }
    return true;
  }
};

// A concurrency limit is the sliding log whose period is the lease TTL.
template <>
struct Algo<ConcurrencyConfig> : Algo<SlidingLogConfig> {
  using Config = ConcurrencyConfig;
  static constexpr std::string_view kName = "concurrency";
};

template <typename Config>
const Rate& RateOfConfig(const Config& config) {
  return config.rate();
}

// ---- behavioural equivalence ----

// A short monotone run of requests starting exactly at `from`, with costs
// and gaps drawn like RandomTrace's.
inline std::vector<Request> ProbeRun(uint64_t seed, const Rate& rate, int64_t capacity, Time from,
                                     int steps) {
  TraceOptions options;
  options.rate = rate;
  options.capacity = capacity;
  options.steps = steps;
  options.start = from;
  options.exact_start = true;
  return RandomTrace(seed, options);
}

// Runs the same probe requests against copies of `a` and `b` from `from` on
// and expects every Decision to be equal: the two states cannot be told apart
// by any later request.
template <typename Config>
testing::AssertionResult SameFuture(const Config& config, const typename Algo<Config>::State& a,
                                    const typename Algo<Config>::State& b, Time from, uint64_t seed,
                                    int steps = 6) {
  using A = Algo<Config>;
  typename A::State x = A::Copy(a);
  typename A::State y = A::Copy(b);
  const std::vector<Request> probes =
      ProbeRun(seed, RateOfConfig(config), A::Capacity(config), from, steps);
  for (size_t i = 0; i < probes.size(); ++i) {
    const Decision dx = A::Step(config, x, probes[i].at, probes[i].cost);
    const Decision dy = A::Step(config, y, probes[i].at, probes[i].cost);
    if (testing::AssertionResult same = SameDecision(dx, dy); !same) {
      return testing::AssertionFailure()
             << "probe " << i << " (cost " << probes[i].cost << " at " << TimeString(probes[i].at)
             << ", from " << TimeString(from) << ") differs:\n " << same.message();
    }
  }
  return testing::AssertionSuccess();
}

// ---- the configs every rule runs over ----

struct AlgorithmCase {
  std::string name;  // a gtest-safe name: "gcra_3per250ms_burst1"
  LimitConfig config;
  // Whether the bucket algorithms represent the rate exactly (bucket_rate.h);
  // the reference models assume the exact rate.
  bool exact_rate = true;
};

inline std::ostream& operator<<(std::ostream& os, const AlgorithmCase& c) { return os << c.name; }

// The rates every algorithm is run at: sub-second fractional intervals
// (3/250ms), seconds, minutes, hours, a day, a fast rate of one period per
// microsecond, and a rate too fine for the tick arithmetic (approximated).
struct NamedRate {
  std::string_view text;
  std::string_view name;
};
inline constexpr NamedRate kRates[] = {
    {"3/250ms", "3per250ms"}, {"7/s", "7perS"},
    {"40/min", "40perMin"},   {"5/h", "5perH"},
    {"1/day", "1perDay"},     {"100/s", "100perS"},
    {"2000/us", "2000perUs"}, {"1000000/999us", "1000000per999us"},
};

inline Rate MustParseRate(std::string_view text) {
  absl::StatusOr<Rate> rate = ParseRate(text);
  if (!rate.ok()) {
    ADD_FAILURE() << "ParseRate(" << text << "): " << rate.status();
    return Rate{1, Duration::Seconds(1)};
  }
  return *rate;
}

inline LimitConfig MustMakeLimit(const LimitOptions& options) {
  absl::StatusOr<LimitConfig> limit = MakeLimit(options);
  if (!limit.ok()) {
    ADD_FAILURE() << "MakeLimit: " << limit.status();
    LimitOptions fallback;
    fallback.rate = {1, Duration::Seconds(1)};
    return *MakeLimit(fallback);
  }
  return *std::move(limit);
}

// Built once; every algorithm at every rate of kRates, with variants.
const std::vector<AlgorithmCase>& AllAlgorithmCases();

// The cases of one algorithm, as its concrete config type.
template <typename Config>
struct NamedConfig {
  std::string name;
  Config config;
  bool exact_rate = true;
};

template <typename Config>
std::vector<NamedConfig<Config>> ConfigsOf(bool exact_only = false) {
  std::vector<NamedConfig<Config>> configs;
  for (const AlgorithmCase& c : AllAlgorithmCases()) {
    if (const Config* config = std::get_if<Config>(&c.config)) {
      if (!exact_only || c.exact_rate) configs.push_back({c.name, *config, c.exact_rate});
    }
  }
  return configs;
}

// Typed tests run over these, named after the algorithm.
using AllConfigTypes =
    testing::Types<TokenBucketConfig, GcraConfig, LeakyPoliceConfig, LeakyShapeConfig,
                   FixedWindowConfig, SlidingLogConfig, SlidingWindowConfig>;
using BucketConfigTypes = testing::Types<TokenBucketConfig, GcraConfig, LeakyPoliceConfig>;

struct AlgorithmTypeName {
  template <typename Config>
  static std::string GetName(int) {
    return std::string(Algo<Config>::kName);
  }
};

}  // namespace sluice::conformance

#endif  // SLUICE_TESTS_CONFORMANCE_ALGORITHMS_H_
