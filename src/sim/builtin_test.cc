// The seeds' numbers, as the built-in scenarios reproduce them.
#include "sim/builtin.h"

#include <numeric>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/engine.h"

namespace sluice::sim {
namespace {

const LimiterRun& RunNamed(const Result& result, std::string_view name) {
  for (const LimiterRun& r : result.runs) {
    if (r.name == name) return r;
  }
  ADD_FAILURE() << "no run named " << name;
  return result.runs.front();
}

Result Simulated(std::string_view name) {
  absl::StatusOr<Scenario> scenario = LoadBuiltin(name);
  EXPECT_TRUE(scenario.ok()) << scenario.status();
  absl::StatusOr<Result> result = Simulate(*scenario, scenario->seed);
  EXPECT_TRUE(result.ok()) << result.status();
  return *std::move(result);
}

int64_t Sum(const std::vector<int64_t>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin),
                         v.begin() + static_cast<std::ptrdiff_t>(std::min(end, v.size())),
                         int64_t{0});
}

TEST(SimBuiltin, EveryScenarioLoadsAndRuns) {
  for (const BuiltinScenario& b : BuiltinScenarios()) {
    absl::StatusOr<Scenario> s = LoadBuiltin(b.name);
    ASSERT_TRUE(s.ok()) << b.name << ": " << s.status();
    EXPECT_EQ(s->name, b.name);
    EXPECT_FALSE(s->limiters.empty());
  }
  EXPECT_TRUE(absl::IsNotFound(LoadBuiltin("nope").status()));
}

TEST(SimLoginStorm, FixedWindowAdmits40AndRejects360InTheFirstMinute) {
  const Result result = Simulated("login-storm");
  const LimiterRun& fixed = RunNamed(result, "fixed_window 40/min");
  ASSERT_EQ(fixed.series.bucket, Duration::Seconds(1));
  EXPECT_EQ(Sum(fixed.series.offered, 0, 60), 400);
  EXPECT_EQ(Sum(fixed.series.admitted, 0, 60), 40);
  EXPECT_EQ(Sum(fixed.series.rejected, 0, 60), 360);
  // Everyone gets through eventually, 40 a minute: the last at 9 minutes.
  EXPECT_EQ(fixed.admitted, 400);
  EXPECT_EQ(fixed.gave_up, 0);
  ASSERT_TRUE(fixed.served_by.has_value());
  EXPECT_GE(*fixed.served_by, Duration::Minutes(9));
}

TEST(SimLoginStorm, RetriesArriveInBlocksAtTheMinuteBoundaries) {
  const Result result = Simulated("login-storm");
  const LimiterRun& fixed = RunNamed(result, "fixed_window 40/min");
  // Every rejected client is told the window's end: all of them return in
  // the same second, 40 fewer each minute, and nothing arrives in between.
  for (size_t second = 1; second < fixed.series.offered.size(); ++second) {
    const int64_t offered = fixed.series.offered[second];
    if (second % 60 == 0 && second <= 540) {
      EXPECT_EQ(offered, 400 - 40 * static_cast<int64_t>(second / 60)) << "at " << second << "s";
      EXPECT_EQ(fixed.series.admitted[second], 40);
    } else {
      EXPECT_EQ(offered, 0) << "at " << second << "s";
    }
  }
  EXPECT_EQ(fixed.peak_retries_1s, 360);
}

TEST(SimLoginStorm, TheOtherAlgorithmsServeTheStormWithinSeconds) {
  const Result result = Simulated("login-storm");
  for (const LimiterRun& r : result.runs) {
    EXPECT_EQ(r.served, 400) << r.name;
    ASSERT_TRUE(r.served_by.has_value()) << r.name;
    if (r.name == "fixed_window 40/min") continue;
    EXPECT_LE(*r.served_by, Duration::Seconds(20)) << r.name;
  }
  // The shaper rejects nothing: it holds the storm and releases it at 40/s.
  const LimiterRun& shape = RunNamed(result, "leaky_bucket shape 40/s");
  EXPECT_EQ(shape.rejected, 0);
  EXPECT_EQ(shape.delayed, 399);
  EXPECT_EQ(shape.max_admitted_1s, 40);
  EXPECT_LE(shape.delay.max, Duration::Seconds(10));
  EXPECT_GE(shape.delay.p99, Duration::Seconds(9));
}

TEST(SimBoundaryBurst, FixedWindowAdmitsTwiceTheLimitSlidingLogNeverMore) {
  const Result result = Simulated("boundary-burst");
  EXPECT_EQ(RunNamed(result, "fixed_window 40/min").max_admitted_period, 80);  // 40 + 40
  EXPECT_EQ(RunNamed(result, "sliding_log 40/min").max_admitted_period, 40);
  EXPECT_EQ(RunNamed(result, "fixed_window 4/h").max_admitted_period, 8);  // 4 + 4
  EXPECT_EQ(RunNamed(result, "sliding_log 4/h").max_admitted_period, 4);
  // In between: the two-window estimate, and a bucket's burst + refill.
  const LimiterRun& sliding = RunNamed(result, "sliding_window 40/min");
  EXPECT_GT(sliding.max_admitted_period, 40);
  EXPECT_LT(sliding.max_admitted_period, 80);
  const LimiterRun& bucket = RunNamed(result, "token_bucket 40/min");
  EXPECT_GT(bucket.max_admitted_period, 40);
  EXPECT_LT(bucket.max_admitted_period, 80);
  // The bucket's own guarantee over the 20 s of traffic: burst + rate * T.
  EXPECT_LE(bucket.admitted, 40 + 40 * 20 / 60 + 1);
}

TEST(SimRetryWave, JitterLowersThePeakOfReturningRequestsAtLeastFivefold) {
  const Result result = Simulated("retry-wave");
  const LimiterRun& identical = RunNamed(result, "identical Retry-After");
  const LimiterRun& jittered = RunNamed(result, "Retry-After + 10s jitter");
  // Identical: ~900 rejected in the first second come back together, one
  // second later, again and again.
  EXPECT_GE(identical.peak_retries_1s, 850);
  EXPECT_GE(identical.peak_retries_1s, 5 * jittered.peak_retries_1s)
      << identical.peak_retries_1s << " vs " << jittered.peak_retries_1s;
  // Both serve everyone; the jittered wave is lower and a little longer.
  EXPECT_EQ(identical.served, 1000);
  EXPECT_EQ(jittered.served, 1000);
  EXPECT_LT(jittered.retries, identical.retries);  // spread out, fewer come back too early
  EXPECT_GT(jittered.retry_wave, identical.retry_wave);
}

TEST(SimFleet, LocalLimitsAdmit600PerMinuteSharedAdmits300) {
  const Result result = Simulated("fleet");
  const LimiterRun& local = RunNamed(result, "local 100/min x6");
  const LimiterRun& shared = RunNamed(result, "shared 300/min");
  // Steady state, after the buckets' first burst is spent (minutes 3 to 6).
  const double local_per_minute = static_cast<double>(Sum(local.series.admitted, 120, 360)) / 4;
  const double shared_per_minute = static_cast<double>(Sum(shared.series.admitted, 120, 360)) / 4;
  EXPECT_NEAR(local_per_minute, 600, 6);
  EXPECT_NEAR(shared_per_minute, 300, 3);
  // What the upstream (300/min) sees: local limits overload it, its queue
  // keeps growing; the shared limit keeps it within its capacity.
  EXPECT_GT(local.peak_backlog, 1000);
  EXPECT_LE(shared.peak_backlog, 301);
}

}  // namespace
}  // namespace sluice::sim
