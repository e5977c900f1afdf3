// The rules every algorithm obeys: a typed test per algorithm, each run on
// all of its configs in AllAlgorithmCases() (3/250ms, 7/s, 40/min, 5/h,
// 1/day, 100/s, 2000/us and an approximated rate, with burst / max_delay /
// queue variants) over seeded random traces. At every step of a trace the rule is
// checked on copies of the state, so each trace probes hundreds of states.
//
// "Behaves like" is checked by SameFuture: the same random run of later
// requests gives equal Decisions (every field) from both states.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

constexpr uint64_t kRulesSeeds[] = {11, 12};
constexpr int kRulesSteps = 300;

template <typename Config>
std::vector<Request> TraceFor(const Config& config, uint64_t seed, bool steps_back = false,
                              Time start = kTraceOrigin) {
  TraceOptions options;
  options.rate = config.rate();
  options.capacity = Algo<Config>::Capacity(config);
  options.steps = kRulesSteps;
  options.steps_back = steps_back;
  options.start = start;
  return RandomTrace(seed, options);
}

// Feeds `trace` to a fresh state and calls
//   on_step(index, request, state_before, decision, state_after, latest)
// after each decision; `latest` is the latest time seen so far, this
// request included. Stops at the first fatal failure (ASSERT_*), and names
// the step it happened at.
template <typename Config, typename OnStep>
void Walk(const Config& config, const std::vector<Request>& trace, OnStep on_step) {
  using A = Algo<Config>;
  typename A::State state{};
  Time latest = Time::FromUnixMicros(INT64_MIN);
  for (size_t i = 0; i < trace.size(); ++i) {
    const typename A::State before = A::Copy(state);
    const Decision d = A::Step(config, state, trace[i].at, trace[i].cost);
    latest = std::max(latest, trace[i].at);
    on_step(i, trace[i], before, d, state, latest);
    if (testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "the failure above is at step " << i << ": cost " << trace[i].cost << " at "
                    << TimeString(trace[i].at) << " -> " << DebugString(d);
      return;
    }
  }
}

template <typename Config>
class AlgorithmRulesTest : public testing::Test {
 protected:
  // Runs `check(config, seed)` for every config of this algorithm (every
  // rate, burst / max_delay / queue variant) and every seed.
  template <typename Check>
  void ForEachConfigAndSeed(Check check) {
    for (const NamedConfig<Config>& c : ConfigsOf<Config>()) {
      for (uint64_t seed : kRulesSeeds) {
        SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
        check(c.config, seed);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
};

TYPED_TEST_SUITE(AlgorithmRulesTest, AllConfigTypes, AlgorithmTypeName);

// cost 0 is a peek: it never changes what later requests see, is never denied
// when a cost-1 request would pass, and reports what a cost-1 request would
// leave plus one (and the same delay).
TYPED_TEST(AlgorithmRulesTest, PeekChangesNothingAndPassesWhenUnitCostWould) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    Walk(config, TraceFor(config, seed),
         [&](size_t, const Request& r, const auto& before, const Decision&, const auto&, Time) {
           auto peeked = A::Copy(before);
           const Decision peek = A::Step(config, peeked, r.at, 0);
           auto unit_state = A::Copy(before);
           const Decision unit = A::Step(config, unit_state, r.at, 1);
           if (unit.allowed) {
             ASSERT_TRUE(peek.allowed) << DebugString(peek);
             ASSERT_EQ(peek.remaining, unit.remaining + 1);
             ASSERT_EQ(peek.delay, unit.delay);
           }
           if constexpr (A::kValueState) {
             ASSERT_TRUE(A::SameState(peeked, before));
           }
           ASSERT_TRUE(SameFuture(config, before, peeked, r.at, seed));
         });
  };
  this->ForEachConfigAndSeed(check);
}

// A cost above what the algorithm can ever admit is denied with
// retry_after == Infinite at every point of every trace (so never passes),
// consumes nothing, and the capacity itself is admissible.
TYPED_TEST(AlgorithmRulesTest, CostAboveCapacityIsDeniedForever) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    const int64_t capacity = A::Capacity(config);
    auto fresh = typename A::State{};
    ASSERT_TRUE(A::Step(config, fresh, kTraceOrigin, capacity).allowed);
    Walk(config, TraceFor(config, seed),
         [&](size_t, const Request& r, const auto&, const Decision&, const auto& after,
             Time latest) {
           for (const int64_t cost : {capacity + 1, capacity + 1000, int64_t{INT64_MAX}}) {
             for (const Time at : {r.at, latest + Duration::Days(1000)}) {
               auto copy = A::Copy(after);
               const Decision d = A::Step(config, copy, at, cost);
               ASSERT_FALSE(d.allowed) << "cost " << cost;
               ASSERT_TRUE(d.retry_after.IsInfinite()) << DebugString(d);
               ASSERT_TRUE(d.can_never_pass());
               ASSERT_EQ(d.limit, capacity);
               if constexpr (A::kValueState) {
                 ASSERT_TRUE(A::SameState(copy, after));
               }
             }
           }
         });
  };
  this->ForEachConfigAndSeed(check);
}

// A denied request consumes nothing: the state is unchanged (sliding_log:
// every later request is decided as if the denied one never happened).
TYPED_TEST(AlgorithmRulesTest, DeniedRequestConsumesNothing) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    int denied = 0;
    Walk(config, TraceFor(config, seed),
         [&](size_t, const Request& r, const auto& before, const Decision& d, const auto& after,
             Time) {
           if (d.allowed) return;
           ++denied;
           if constexpr (A::kValueState) {
             ASSERT_TRUE(A::SameState(after, before));
           }
           ASSERT_TRUE(SameFuture(config, before, after, r.at, seed));
         });
    EXPECT_GT(denied, 0) << "the trace should exercise denials";
  };
  this->ForEachConfigAndSeed(check);
}

// After seeing time t, deciding at t' < t admits no more than deciding at t:
// for each cost the answer at t' is no more permissive, and a burst of unit
// requests at t' gets no more through than one at t. Checked for steps back
// of 1us, up to a period, three periods, and back to 1970, on traces that
// themselves step back, and on traces near the year 2070 (no overflow).
TYPED_TEST(AlgorithmRulesTest, ClockSteppingBackGrantsNothing) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    const int64_t capacity = A::Capacity(config);
    const int64_t period = config.rate().period.micros();
    auto burst_count = [&](const auto& state, Time at) {
      auto copy = A::Copy(state);
      int count = 0;
      while (count < 16 && A::Step(config, copy, at, 1).allowed) ++count;
      return count;
    };
    if (seed != kRulesSeeds[0]) return;  // four traces per seed already
    TraceRng rng(seed);
    for (const Time start : {kTraceOrigin, kYear2070 - Duration::Days(30)}) {
      for (const bool steps_back : {false, true}) {
        Walk(config, TraceFor(config, seed, steps_back, start),
             [&](size_t, const Request&, const auto&, const Decision&, const auto& after,
                 Time latest) {
               for (const int64_t back : {int64_t{1}, rng.Uniform(1, period), 3 * period,
                                          (latest - kNearEpoch).micros()}) {
                 const Time earlier = std::max(kNearEpoch, latest - Duration::Micros(back));
                 for (const int64_t cost : {int64_t{0}, int64_t{1}, int64_t{2}, capacity}) {
                   auto x = A::Copy(after);
                   auto y = A::Copy(after);
                   const Decision then = A::Step(config, x, earlier, cost);
                   const Decision now = A::Step(config, y, latest, cost);
                   ASSERT_TRUE(!then.allowed || now.allowed)
                       << "cost " << cost << " at " << TimeString(earlier) << ": "
                       << DebugString(then) << " but at " << TimeString(latest) << ": "
                       << DebugString(now);
                 }
                 ASSERT_LE(burst_count(after, earlier), burst_count(after, latest))
                     << "at " << TimeString(earlier);
               }
             });
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  };
  this->ForEachConfigAndSeed(check);
}

// An idle gap of decades (1970 -> 2070, 2024 -> 2070) neither overflows nor
// leaves a trace: the key behaves exactly like a new one.
TYPED_TEST(AlgorithmRulesTest, IdleGapOfDecadesReturnsToFresh) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    for (const Time start : {kNearEpoch + Duration::Days(1), kTraceOrigin}) {
      Walk(config, TraceFor(config, seed, /*steps_back=*/false, start),
           [&](size_t i, const Request&, const auto&, const Decision&, const auto& after, Time) {
             if (i % 25 != 0 && i + 1 != kRulesSteps) return;
             ASSERT_TRUE(SameFuture(config, after, typename A::State{}, kYear2070, seed + i));
             // And back from 2070 to the state's own time: nothing breaks.
             auto copy = A::Copy(after);
             A::Step(config, copy, kYear2070, 1);
             A::Step(config, copy, start, 1);
           });
      if (testing::Test::HasFatalFailure()) return;
    }
  };
  this->ForEachConfigAndSeed(check);
}

// retry_after is exact: denied at t with a finite retry_after r, the same
// request passes at t + r and is still denied at t + r - 1us (with nothing
// else happening in between).
template <typename Config>
void CheckRetryAfterIsExact(const Config& config, uint64_t seed, bool steps_back) {
  using A = Algo<Config>;
  int checked = 0;
  Walk(config, TraceFor(config, seed, steps_back),
       [&](size_t, const Request& r, const auto&, const Decision& d, const auto& after, Time) {
         if (d.allowed || d.retry_after.IsInfinite()) return;
         ++checked;
         ASSERT_GE(d.retry_after, Duration::Micros(1));
         auto at_retry = A::Copy(after);
         const Decision then = A::Step(config, at_retry, r.at + d.retry_after, r.cost);
         ASSERT_TRUE(then.allowed) << "at t + retry_after: " << DebugString(then);
         auto just_before = A::Copy(after);
         const Decision early =
             A::Step(config, just_before, r.at + d.retry_after - Duration::Micros(1), r.cost);
         ASSERT_FALSE(early.allowed) << "at t + retry_after - 1us: " << DebugString(early);
       });
  EXPECT_GT(checked, 0);
}

TYPED_TEST(AlgorithmRulesTest, RetryAfterIsExact) {
  auto check = [&](const auto& config, uint64_t seed) {
    CheckRetryAfterIsExact(config, seed, /*steps_back=*/false);
  };
  this->ForEachConfigAndSeed(check);
}

TYPED_TEST(AlgorithmRulesTest, RetryAfterIsExactAfterClockStepsBack) {
  auto check = [&](const auto& config, uint64_t seed) {
    CheckRetryAfterIsExact(config, seed, /*steps_back=*/true);
  };
  this->ForEachConfigAndSeed(check);
}

// At FreshAt(state) the state behaves exactly like a default-constructed
// one, and FreshAt is the earliest such time: one microsecond before, a peek
// tells them apart.
TYPED_TEST(AlgorithmRulesTest, FreshAtIsWhenTheStateBehavesLikeNew) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    Walk(config, TraceFor(config, seed),
         [&](size_t i, const Request&, const auto&, const Decision&, const auto& after,
             Time latest) {
           const Time fresh_at = A::FreshTime(config, after);
           ASSERT_TRUE(
               SameFuture(config, after, typename A::State{}, std::max(fresh_at, latest), seed + i))
               << "FreshAt " << TimeString(fresh_at);
           if (fresh_at > latest) {
             const Time before = fresh_at - Duration::Micros(1);
             auto copy = A::Copy(after);
             auto fresh = typename A::State{};
             ASSERT_FALSE(
                 SameDecision(A::Step(config, copy, before, 0), A::Step(config, fresh, before, 0)))
                 << "not yet fresh at FreshAt - 1us = " << TimeString(before);
           }
         });
  };
  this->ForEachConfigAndSeed(check);
}

// Refund of an admitted request restores the behaviour from before it
// (leaky_bucket shape: a departure slot once given is kept, Refund changes
// nothing, as its header documents).
TYPED_TEST(AlgorithmRulesTest, RefundAfterAdmitRestoresPreviousBehaviour) {
  auto check = [&](const auto& config, uint64_t seed) {
    using Config = std::decay_t<decltype(config)>;
    using A = Algo<Config>;
    int refunds = 0;
    Walk(config, TraceFor(config, seed),
         [&](size_t i, const Request& r, const auto& before, const Decision& d, const auto& after,
             Time) {
           if (!d.allowed || r.cost == 0) return;
           ++refunds;
           auto refunded = A::Copy(after);
           A::GiveBack(config, refunded, r.at, r.cost);
           if constexpr (std::is_same_v<Config, LeakyShapeConfig>) {
             ASSERT_TRUE(A::SameState(refunded, after));
           } else {
             ASSERT_TRUE(SameFuture(config, before, refunded, r.at, seed + i));
           }
         });
    EXPECT_GT(refunds, 0);
  };
  this->ForEachConfigAndSeed(check);
}

// A refund of more than was taken (a caller's mistake, or a refund for a
// request made long ago) never leaves more room than a new key has: after
// giving back `capacity` that was never taken, a request of `capacity` may
// pass, but then nothing more does.
TYPED_TEST(AlgorithmRulesTest, OverRefundNeverLeavesMoreRoomThanANewKey) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    const int64_t capacity = A::Capacity(config);
    Walk(config, TraceFor(config, seed),
         [&](size_t, const Request& r, const auto&, const Decision&, const auto& after, Time) {
           auto refunded = A::Copy(after);
           A::GiveBack(config, refunded, r.at, capacity);
           A::GiveBack(config, refunded, r.at - config.rate().period, capacity);
           if (A::Step(config, refunded, r.at, capacity).allowed) {
             ASSERT_FALSE(A::Step(config, refunded, r.at, 1).allowed);
           }
         });
  };
  this->ForEachConfigAndSeed(check);
}

// reset_after says when the key is fresh again: from now + reset_after on it
// behaves like a new key, and on monotone traces now + reset_after is
// exactly FreshAt of the new state (or now, when it is fresh already).
TYPED_TEST(AlgorithmRulesTest, ResetAfterIsWhenTheKeyIsFresh) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    for (const bool steps_back : {false, true}) {
      Walk(config, TraceFor(config, seed, steps_back),
           [&](size_t i, const Request& r, const auto&, const Decision& d, const auto& after,
               Time latest) {
             ASSERT_GE(d.reset_after, Duration::Zero());
             ASSERT_TRUE(SameFuture(config, after, typename A::State{},
                                    std::max(r.at + d.reset_after, latest), seed + i));
             if (!steps_back) {
               ASSERT_EQ(TimeString(r.at + d.reset_after),
                         TimeString(std::max(r.at, A::FreshTime(config, after))));
             }
           });
      if (testing::Test::HasFatalFailure()) return;
    }
  };
  this->ForEachConfigAndSeed(check);
}

// remaining is exactly the largest cost that could pass right now, after the
// decision: that cost passes, one more does not (and at 0 or below a unit
// does not).
TYPED_TEST(AlgorithmRulesTest, RemainingIsTheLargestCostThatPassesNow) {
  auto check = [&](const auto& config, uint64_t seed) {
    using A = Algo<std::decay_t<decltype(config)>>;
    for (const bool steps_back : {false, true}) {
      Walk(config, TraceFor(config, seed, steps_back),
           [&](size_t, const Request& r, const auto&, const Decision& d, const auto& after, Time) {
             if (d.remaining > 0) {
               auto copy = A::Copy(after);
               ASSERT_TRUE(A::Step(config, copy, r.at, d.remaining).allowed);
             }
             // (Below zero, a debt: not even one unit passes.)
             auto copy = A::Copy(after);
             ASSERT_FALSE(
                 A::Step(config, copy, r.at, std::max<int64_t>(d.remaining, 0) + 1).allowed);
           });
      if (testing::Test::HasFatalFailure()) return;
    }
  };
  this->ForEachConfigAndSeed(check);
}

// The fields of every Decision are well-formed: limit is the capacity;
// retry_after is zero when allowed, positive when denied, infinite exactly
// when the cost exceeds the capacity; 0 <= remaining <= limit (below zero,
// by the units short, after the clock stepped back behind what was taken);
// delays only from leaky_bucket shape and only for admitted requests.
TYPED_TEST(AlgorithmRulesTest, DecisionFieldsAreWellFormed) {
  auto check = [&](const auto& config, uint64_t seed) {
    using Config = std::decay_t<decltype(config)>;
    using A = Algo<Config>;
    const int64_t capacity = A::Capacity(config);
    for (const bool steps_back : {false, true}) {
      Walk(config, TraceFor(config, seed, steps_back),
           [&](size_t, const Request& r, const auto&, const Decision& d, const auto&, Time) {
             ASSERT_EQ(d.limit, capacity);
             // Below zero only after the clock stepped back (gcra: a TAT
             // ahead; sliding_window: the previous window counted in
             // full), and by at most the debt a key may owe.
             if (!steps_back) ASSERT_GE(d.remaining, 0);
             if (capacity <= INT64_MAX / kMaxDebtLimits) {
               ASSERT_GE(d.remaining, -kMaxDebtLimits * capacity);
             }
             ASSERT_LE(d.remaining, capacity);
             ASSERT_GE(d.reset_after, Duration::Zero());
             ASSERT_EQ(d.retry_after.IsInfinite(), r.cost > capacity);
             if (d.allowed) {
               ASSERT_EQ(d.retry_after, Duration::Zero());
             } else {
               ASSERT_GT(d.retry_after, Duration::Zero());
               ASSERT_EQ(d.delay, Duration::Zero());
             }
             ASSERT_GE(d.delay, Duration::Zero());
             if constexpr (!std::is_same_v<Config, LeakyShapeConfig>) {
               ASSERT_EQ(d.delay, Duration::Zero());
             }
           });
      if (testing::Test::HasFatalFailure()) return;
    }
  };
  this->ForEachConfigAndSeed(check);
}

}  // namespace
}  // namespace sluice::conformance
