// fixed_window and sliding_log: their limits, checked by brute force over
// the admitted requests of random traces, and the fixed-window straddle.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

constexpr uint64_t kWindowSeeds[] = {401, 402, 403};

template <typename Config>
Config MakeWindow(std::string_view rate) {
  absl::StatusOr<Config> config = Config::Create({.rate = MustParseRate(rate)});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<Request> HeavyTrace(const Rate& rate, uint64_t seed) {
  TraceOptions options;
  options.rate = rate;
  options.capacity = rate.limit;
  options.steps = 3000;
  options.load = 3;
  return RandomTrace(seed, options);
}

// ---- fixed_window ----

// At most `limit` per window, windows being [k * period, (k+1) * period) in
// microseconds since the Unix epoch; and it admits whenever the window has
// room (no under-admission).
TEST(FixedWindowTest, AdmitsAtMostLimitPerEpochAlignedWindow) {
  for (const NamedConfig<FixedWindowConfig>& c : ConfigsOf<FixedWindowConfig>()) {
    const FixedWindowConfig& config = c.config;
    const int64_t period = config.period().micros();
    for (uint64_t seed : kWindowSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      FixedWindowState state;
      std::map<int64_t, int64_t> admitted;  // window -> cost
      for (const Request& r : HeavyTrace(config.rate(), seed)) {
        const int64_t window = r.at.unix_micros() / period;
        const bool fits = r.cost <= config.limit() && admitted[window] + r.cost <= config.limit();
        const Decision d = Algo<FixedWindowConfig>::Step(config, state, r.at, r.cost);
        ASSERT_EQ(d.allowed, fits) << "cost " << r.cost << " at " << TimeString(r.at);
        if (d.allowed) admitted[window] += r.cost;
      }
      for (const auto& [window, cost] : admitted) ASSERT_LE(cost, config.limit());
    }
  }
}

// The documented weakness, demonstrated: at 40/min, 40 requests in the last
// half second of one minute and 40 in the first half second of the next are
// all admitted: 80, twice the limit, inside one 60s interval (in fact inside
// one second).
TEST(FixedWindowEdgeTest, StraddlingABoundaryAdmitsTwiceTheLimitInOnePeriod) {
  const FixedWindowConfig config = MakeWindow<FixedWindowConfig>("40/min");
  FixedWindowState state;
  const Time minute = kTraceOrigin + Duration::Minutes(1);  // 00:01:00 UTC
  std::vector<Time> admitted;
  for (int k = 0; k < 41; ++k) {  // 00:00:59.500 .. 00:00:59.980: the 41st is denied
    const Time t = minute - Duration::Millis(500) + Duration::Millis(12 * k);
    const Decision d = Algo<FixedWindowConfig>::Step(config, state, t, 1);
    if (d.allowed) admitted.push_back(t);
    if (k == 40) {
      EXPECT_FALSE(d.allowed);
      EXPECT_EQ(t + d.retry_after, minute);  // told to come back at 00:01:00
    }
  }
  for (int k = 0; k < 41; ++k) {  // 00:01:00.000 .. 00:01:00.480
    const Time t = minute + Duration::Millis(12 * k);
    const Decision d = Algo<FixedWindowConfig>::Step(config, state, t, 1);
    if (d.allowed) admitted.push_back(t);
    if (k == 40) {
      EXPECT_FALSE(d.allowed);
    }
  }
  ASSERT_EQ(admitted.size(), 80u);
  EXPECT_LT(admitted.back() - admitted.front(), Duration::Seconds(1));
  std::cout << "[ measured ] fixed_window 40/min: " << admitted.size() << " admitted within "
            << (admitted.back() - admitted.front()).micros()
            << "us around a minute boundary (2.0x the limit in one 60s interval)\n";
}

// Windows start at whole multiples of the period since the epoch: a 1/day
// window is a UTC calendar day.
TEST(FixedWindowEdgeTest, DayWindowsAreUtcCalendarDays) {
  const FixedWindowConfig config = MakeWindow<FixedWindowConfig>("1/day");
  FixedWindowState state;
  const Time midnight = kTraceOrigin + Duration::Days(10);
  EXPECT_TRUE(
      Algo<FixedWindowConfig>::Step(config, state, midnight - Duration::Micros(1), 1).allowed);
  const Decision d =
      Algo<FixedWindowConfig>::Step(config, state, midnight - Duration::Micros(1), 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, Duration::Micros(1));
  EXPECT_TRUE(Algo<FixedWindowConfig>::Step(config, state, midnight, 1).allowed);
  const Decision next =
      Algo<FixedWindowConfig>::Step(config, state, midnight + Duration::Hours(23), 1);
  EXPECT_FALSE(next.allowed);
  EXPECT_EQ(next.retry_after, Duration::Hours(1));
  EXPECT_EQ(next.reset_after, Duration::Hours(1));
}

// ---- sliding_log ----

// Exact: over random traces at 3x the limit, never more than `limit` cost in
// any half-open interval [t, t + period), checked from every admitted
// request; and a request is denied only if admitting it would put more than
// `limit` in the period ending at it (checked against the list of admitted
// requests), so the log admits everything it may.
TEST(SlidingLogTest, NeverMoreThanLimitInAnyPeriodAndDeniesOnlyWhenItMust) {
  for (const NamedConfig<SlidingLogConfig>& c : ConfigsOf<SlidingLogConfig>()) {
    const SlidingLogConfig& config = c.config;
    const int64_t period = config.period().micros();
    for (uint64_t seed : kWindowSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      SlidingLogState state;
      std::vector<Request> admitted;
      size_t window_start = 0;  // first admitted request inside (t - period, t]
      int64_t in_window = 0;
      for (const Request& r : HeavyTrace(config.rate(), seed)) {
        while (window_start < admitted.size() &&
               admitted[window_start].at.unix_micros() <= r.at.unix_micros() - period) {
          in_window -= admitted[window_start++].cost;
        }
        const Decision d = Algo<SlidingLogConfig>::Step(config, state, r.at, r.cost);
        const bool fits = r.cost <= config.limit() && in_window + r.cost <= config.limit();
        ASSERT_EQ(d.allowed, fits) << "cost " << r.cost << " at " << TimeString(r.at) << " with "
                                   << in_window << " in the period before";
        if (d.allowed && r.cost > 0) {
          admitted.push_back(r);
          in_window += r.cost;
        }
      }
      ASSERT_GT(admitted.size(), 100u);
      // Brute force, independently: from every admitted request's time t, the
      // cost admitted in [t, t + period).
      for (size_t i = 0; i < admitted.size(); ++i) {
        int64_t sum = 0;
        for (size_t j = i; j < admitted.size() && admitted[j].at - admitted[i].at < config.period();
             ++j) {
          sum += admitted[j].cost;
        }
        ASSERT_LE(sum, config.limit()) << "in [" << TimeString(admitted[i].at) << ", +period)";
      }
    }
  }
}

// Day-long periods: at 1/day the next request passes exactly one day after
// the last one, not a microsecond earlier, whatever the calendar.
TEST(SlidingLogEdgeTest, OnePerDayMeansOneInEveryTwentyFourHours) {
  const SlidingLogConfig config = MakeWindow<SlidingLogConfig>("1/day");
  SlidingLogState state;
  const Time t0 = kTraceOrigin + Duration::Hours(23) + Duration::Minutes(59);
  EXPECT_TRUE(Algo<SlidingLogConfig>::Step(config, state, t0, 1).allowed);
  const Decision d = Algo<SlidingLogConfig>::Step(config, state, t0 + Duration::Minutes(2), 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, Duration::Days(1) - Duration::Minutes(2));
  EXPECT_FALSE(
      Algo<SlidingLogConfig>::Step(config, state, t0 + Duration::Days(1) - Duration::Micros(1), 1)
          .allowed);
  EXPECT_TRUE(Algo<SlidingLogConfig>::Step(config, state, t0 + Duration::Days(1), 1).allowed);
}

// A refund for a request that has already left the window gives nothing
// back: it must not free the place of another request still in the log
// (Limiter::Refund takes any taken_at, e.g. after an upstream failure).
TEST(SlidingLogEdgeTest, RefundOfARequestThatLeftTheWindowFreesNothing) {
  using Log = Algo<SlidingLogConfig>;
  const SlidingLogConfig config = MakeWindow<SlidingLogConfig>("2/min");
  SlidingLogState state;
  const Time t0 = kTraceOrigin;
  ASSERT_TRUE(Log::Step(config, state, t0, 1).allowed);                          // A
  ASSERT_TRUE(Log::Step(config, state, t0 + Duration::Seconds(70), 1).allowed);  // B
  Log::GiveBack(config, state, t0, 1);  // A left the window at t0 + 60s
  ASSERT_TRUE(Log::Step(config, state, t0 + Duration::Seconds(71), 1).allowed);  // C
  // B and C are in (t0 + 12s, t0 + 72s]: a third must wait until B leaves.
  const Decision d = Log::Step(config, state, t0 + Duration::Seconds(72), 1);
  EXPECT_FALSE(d.allowed) << "B's place was given away by A's refund";
  EXPECT_EQ(d.retry_after, Duration::Seconds(58));
}

// The log's memory stays bounded by the limit: entries never exceed
// `limit`, and an idle key gives its buffer back.
TEST(SlidingLogEdgeTest, MemoryIsBoundedByTheLimitAndFreedWhenIdle) {
  const SlidingLogConfig config = MakeWindow<SlidingLogConfig>("100/s");
  SlidingLogState state;
  TraceOptions options;
  options.rate = config.rate();
  options.capacity = config.limit();
  options.steps = 3000;
  options.load = 5;
  for (const Request& r : RandomTrace(404, options)) {
    Algo<SlidingLogConfig>::Step(config, state, r.at, r.cost);
    ASSERT_LE(state.size(), config.limit());
    ASSERT_LE(state.heap_bytes(), 128 * static_cast<int64_t>(sizeof(SlidingLogState::Entry)));
  }
  Algo<SlidingLogConfig>::Step(config, state, kYear2070, 0);
  EXPECT_EQ(state.size(), 0);
  EXPECT_EQ(state.heap_bytes(), 0);
}

// CertainDenial answers from the log's summary exactly what Decide answers,
// and only where Decide changes nothing but the latest time seen: heavy
// traces with mixed costs, the clock stepping back, every config.
TEST(SlidingLogEdgeTest, CertainDenialIsDecidesOwnAnswer) {
  for (const NamedConfig<SlidingLogConfig>& c : ConfigsOf<SlidingLogConfig>()) {
    const SlidingLogConfig& config = c.config;
    int64_t certain = 0;
    for (uint64_t seed : kWindowSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      TraceOptions options;
      options.rate = config.rate();
      options.capacity = config.limit();
      options.steps = 3000;
      options.load = 4;
      options.steps_back = true;
      SlidingLogState state;
      for (const Request& r : RandomTrace(seed, options)) {
        const SlidingLogState::Summary before = state.summary();
        const std::optional<Decision> shortcut = CertainDenial(config, before, r.at, r.cost);
        const Decision d = Decide(config, state, r.at, r.cost);
        if (!shortcut) continue;
        ++certain;
        ASSERT_FALSE(shortcut->allowed);
        ASSERT_EQ(d.allowed, shortcut->allowed) << "at " << TimeString(r.at);
        ASSERT_EQ(d.limit, shortcut->limit);
        ASSERT_EQ(d.remaining, shortcut->remaining);
        ASSERT_EQ(d.retry_after, shortcut->retry_after);
        ASSERT_EQ(d.reset_after, shortcut->reset_after);
        ASSERT_EQ(d.delay, shortcut->delay);
        SlidingLogState::Summary expected = before;
        expected.last_us = std::max(before.last_us, r.at.unix_micros());
        ASSERT_EQ(state.summary(), expected) << "Decide changed more than the time seen";
      }
    }
    EXPECT_GT(certain, 300) << c.name << ": too few certain denials to show anything";
  }
}

}  // namespace
}  // namespace sluice::conformance
