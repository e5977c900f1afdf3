#include "sim/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/scenario_file.h"

namespace sluice::sim {
namespace {

Scenario Parse(std::string_view yaml) {
  absl::StatusOr<Scenario> s = ParseScenario(yaml, "test.yaml", "test");
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

LimiterRun RunOnly(std::string_view yaml, uint64_t seed = 1) {
  const Scenario s = Parse(yaml);
  absl::StatusOr<LimiterRun> run = SimulateRun(s, 0, seed);
  EXPECT_TRUE(run.ok()) << run.status();
  return *std::move(run);
}

TEST(SimEngine, SeveralLimitsGoThroughTheLimiterAllOrNothing) {
  // 100/s for 10 s: the bucket alone would admit 10 + 10 * 10, the minute
  // window caps the whole at 50; denials by the window take no tokens.
  const LimiterRun r = RunOnly(R"(
duration: 10s
clients: [{name: c, traffic: [{constant: 100/s}]}]
limiters:
  - limits: [{algorithm: token_bucket, rate: 10/s}, {algorithm: fixed_window, rate: 50/min}]
)");
  EXPECT_EQ(r.requests, 1000);
  EXPECT_EQ(r.admitted, 50);
  EXPECT_EQ(r.limits, "token_bucket 10/s; fixed_window 50/min");
}

TEST(SimEngine, AConcurrencyLimitHoldsTheFlightAtItsSlots) {
  // 100/s of requests that take 100 ms each: 10 in flight at once when
  // nothing limits them; at most 4 with 4 slots, which the answers' service
  // gives back (a slot per request, held exactly its 100 ms), so 40 a second
  // pass.
  const std::string scenario = R"(
duration: 10s
service_time: 100ms
clients: [{name: c, key: group, traffic: [{constant: 100/s}]}]
limiters:
  - {algorithm: concurrency, limit: 4, lease_ttl: 30s}
  - limits: [{algorithm: concurrency, limit: 4}, {algorithm: gcra, rate: 1000/s}]
  - {algorithm: gcra, rate: 1000/s}
)";
  const Scenario s = Parse(scenario);
  for (size_t i : {0, 1}) {
    absl::StatusOr<LimiterRun> r = SimulateRun(s, i, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->peak_in_flight, 4) << r->name;
    EXPECT_EQ(r->admitted, 400) << r->name;
  }
  absl::StatusOr<LimiterRun> rate_only = SimulateRun(s, 2, 1);
  ASSERT_TRUE(rate_only.ok());
  EXPECT_EQ(rate_only->peak_in_flight, 10);
  EXPECT_EQ(rate_only->admitted, 1000);
}

TEST(SimEngine, ServiceTimesAreDrawnFromTheirDistribution) {
  // Exponential, mean 50 ms, 200/s for 10 s: about 10 in flight on
  // average; the most at once is above that and bounded.
  const LimiterRun r = RunOnly(R"(
duration: 10s
service_time: {exponential: 50ms}
clients: [{name: c, key: group, traffic: [{poisson: 200/s}]}]
limiters: [{algorithm: gcra, rate: 100000/s}]
)");
  EXPECT_GT(r.peak_in_flight, 12);
  EXPECT_LT(r.peak_in_flight, 60);
  const LimiterRun u = RunOnly(R"(
duration: 10s
service_time: {uniform: [10ms, 10ms]}
clients: [{name: c, key: group, traffic: [{constant: 100/s}]}]
limiters: [{algorithm: gcra, rate: 100000/s}]
)");
  EXPECT_EQ(u.peak_in_flight, 1);  // each done before the next, 10 ms apart
}

TEST(SimEngine, ShapingReleasesNoFasterThanTheRate) {
  const LimiterRun r = RunOnly(R"(
duration: 1m
clients: [{name: c, traffic: [{burst: 20, at: 0s}]}]
limiters: [{algorithm: leaky_bucket, mode: shape, rate: 10/s, max_delay: 10s}]
)");
  EXPECT_EQ(r.admitted, 20);
  EXPECT_EQ(r.delayed, 19);
  EXPECT_EQ(r.max_admitted_1s, 10);  // departures 100 ms apart
  EXPECT_EQ(r.delay.max, Duration::Millis(1900));
  ASSERT_TRUE(r.served_by.has_value());
  EXPECT_EQ(*r.served_by, Duration::Millis(1900));
  EXPECT_EQ(r.admitted_cv, 0);  // 10 per second, both seconds
}

TEST(SimEngine, FixedRetryGivesUpAfterMaxAttempts) {
  // One slot a minute: the second client retries at 10 s and 20 s, then
  // gives up (three tries in all).
  const LimiterRun r = RunOnly(R"(
duration: 1m
clients:
  - name: c
    count: 2
    key: global
    retry: {policy: fixed, delay: 10s, max_attempts: 3}
    traffic: [{burst: 2, at: 0s}]
limiters: [{algorithm: fixed_window, rate: 1/min}]
)");
  EXPECT_EQ(r.requests, 2);
  EXPECT_EQ(r.offered, 4);
  EXPECT_EQ(r.retries, 2);
  EXPECT_EQ(r.admitted, 1);
  EXPECT_EQ(r.gave_up, 1);
  EXPECT_EQ(r.series.offered[10], 1);
  EXPECT_EQ(r.series.offered[20], 1);
}

TEST(SimEngine, RetriesPastTheEndAreCountedUnfinished) {
  const LimiterRun r = RunOnly(R"(
duration: 30s
clients: [{name: c, count: 5, key: global, retry: retry_after, traffic: [{burst: 5, at: 0s}]}]
limiters: [{algorithm: fixed_window, rate: 1/min, retry_after_jitter: 0s}]
)");
  EXPECT_EQ(r.admitted, 1);
  EXPECT_EQ(r.unfinished, 4);  // told to come back at 60 s
  EXPECT_EQ(r.gave_up, 0);
}

TEST(SimEngine, ServerJitterDefaultsToATenthOfThePeriod) {
  // Without retry_after_jitter, Retry-After is spread as `sluice serve`
  // spreads it: over a tenth of the period (6 s of a minute).
  const LimiterRun r = RunOnly(R"(
duration: 2m
clients: [{name: c, count: 200, key: global, retry: retry_after, traffic: [{burst: 200, at: 0s}]}]
limiters: [{algorithm: fixed_window, rate: 100/min}]
)");
  int64_t seconds_with_retries = 0;
  for (size_t s = 60; s < 70; ++s) seconds_with_retries += r.series.retries[s] > 0 ? 1 : 0;
  EXPECT_GE(seconds_with_retries, 5);
  EXPECT_EQ(r.series.retries[59], 0);  // never earlier than the exact wait
}

TEST(SimEngine, BackoffIsCappedAndJittered) {
  const LimiterRun r = RunOnly(R"(
duration: 10m
clients:
  - {name: c, count: 100, key: global, retry: {policy: backoff, base: 1s, cap: 8s}, traffic: [{burst: 100, at: 0s}]}
limiters: [{algorithm: token_bucket, rate: 5/s}]
)");
  EXPECT_EQ(r.served, 100);
  EXPECT_GT(r.retries, 100);
  // Full jitter: a wait anywhere in [0, min(cap, base * 2^n)], so retries
  // start within the first second and spread over many.
  EXPECT_GT(r.series.retries[0], 0);
  int64_t seconds_with_retries = 0;
  for (int64_t n : r.series.retries) seconds_with_retries += n > 0 ? 1 : 0;
  EXPECT_GE(seconds_with_retries, 5);
}

TEST(SimEngine, DownstreamQueueDropsWhatDoesNotFit) {
  const LimiterRun r = RunOnly(R"(
duration: 1m
downstream: {capacity: 1/s, queue: 2}
clients: [{name: c, count: 10, traffic: [{burst: 10, at: 0s}]}]
limiters: [{algorithm: token_bucket, rate: 100/s}]
)");
  EXPECT_EQ(r.admitted, 10);
  EXPECT_EQ(r.served, 3);  // one in service, two waiting
  EXPECT_EQ(r.dropped, 7);
  EXPECT_EQ(r.peak_backlog, 3);
  EXPECT_EQ(r.max_queue_wait, Duration::Seconds(2));
  ASSERT_TRUE(r.served_by.has_value());
  EXPECT_EQ(*r.served_by, Duration::Seconds(3));
}

TEST(SimEngine, LocalStateMultipliesTheLimitSharedStateDoesNot) {
  constexpr std::string_view kYaml = R"(
duration: 1m
instances: 4
clients: [{name: c, count: 10, key: global, traffic: [{constant: 100/s}]}]
limiters:
  - {name: local, algorithm: sliding_log, rate: 10/min, scope: local}
  - {name: shared, algorithm: sliding_log, rate: 10/min, scope: global}
)";
  const Scenario s = Parse(kYaml);
  absl::StatusOr<Result> result = Simulate(s, 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->runs[0].admitted, 40);
  EXPECT_EQ(result->runs[1].admitted, 10);
}

TEST(SimEngine, StickyBalancingKeepsAClientOnOneInstance) {
  // Two clients, three instances, a local limit per client key: sticky, a
  // key is limited on one instance; round robin, on each it reaches.
  const Scenario s = Parse(R"(
duration: 1m
instances: 3
balance: sticky
clients: [{name: c, count: 2, traffic: [{constant: 10/s}]}]
limiters: [{algorithm: sliding_log, rate: 5/min}]
)");
  absl::StatusOr<LimiterRun> sticky = SimulateRun(s, 0, 1);
  ASSERT_TRUE(sticky.ok());
  EXPECT_EQ(sticky->admitted, 10);  // 2 keys x 5, each on one instance
  Scenario round_robin = s;
  round_robin.balance = Balance::kRoundRobin;
  absl::StatusOr<LimiterRun> spread = SimulateRun(round_robin, 0, 1);
  ASSERT_TRUE(spread.ok());
  EXPECT_EQ(spread->admitted, 30);  // each client's requests reach all three instances
}

TEST(SimEngine, PoissonAndDiurnalArriveAtTheirRates) {
  const LimiterRun poisson = RunOnly(R"(
duration: 100s
clients: [{name: c, count: 50, traffic: [{poisson: 100/s}]}]
limiters: [{algorithm: gcra, rate: 1000/s}]
)");
  EXPECT_NEAR(static_cast<double>(poisson.requests), 10000, 400);
  // Rate between 1/s and 9/s over an hour, peaking at 30 min: 5/s on average,
  // and far more in the half hour around the peak than in the rest.
  const LimiterRun diurnal = RunOnly(R"(
duration: 1h
clients: [{name: c, traffic: [{diurnal: {low: 1/s, high: 9/s, peak_at: 30m, cycle: 1h}}]}]
limiters: [{algorithm: gcra, rate: 1000/s}]
)");
  EXPECT_NEAR(static_cast<double>(diurnal.requests), 18000, 600);
  int64_t middle = 0, edges = 0;
  const auto bucket_s = static_cast<size_t>(diurnal.series.bucket.micros() / 1'000'000);
  for (size_t i = 0; i < diurnal.series.offered.size(); ++i) {
    const size_t s = i * bucket_s;
    (s >= 900 && s < 2700 ? middle : edges) += diurnal.series.offered[i];
  }
  EXPECT_GT(middle, 2 * edges);
}

TEST(SimEngine, SameSeedSameRunOtherSeedOtherTraffic) {
  constexpr std::string_view kYaml = R"(
duration: 1m
clients: [{name: c, count: 20, retry: {policy: retry_after, jitter: 1s}, traffic: [{poisson: 50/s}]}]
limiters: [{algorithm: token_bucket, rate: 1/s, burst: 5}]
)";
  const LimiterRun a = RunOnly(kYaml, 7);
  const LimiterRun b = RunOnly(kYaml, 7);
  const LimiterRun c = RunOnly(kYaml, 8);
  EXPECT_EQ(a.series.offered, b.series.offered);
  EXPECT_EQ(a.offered, b.offered);
  EXPECT_EQ(a.latency.p99, b.latency.p99);
  EXPECT_NE(a.series.offered, c.series.offered);
}

TEST(SimEngine, RejectsScenariosOutOfBounds) {
  Scenario s = Parse(R"(
duration: 1m
clients: [{name: c, traffic: [{burst: 1}]}]
limiters: [{algorithm: gcra, rate: 1/s}]
)");
  s.instances = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Simulate(s, 1).status()));
  s.instances = 1;
  s.groups[0].clients = kMaxClients + 1;
  EXPECT_TRUE(absl::IsInvalidArgument(Simulate(s, 1).status()));
}

TEST(SimDescribeLimit, NamesTheSettingsThatDifferFromTheDefaults) {
  EXPECT_EQ(DescribeLimit(
                {.algorithm = Algorithm::kGcra, .rate = {100, Duration::Seconds(1)}, .burst = 20}),
            "gcra 100/s burst 20");
  EXPECT_EQ(DescribeLimit({.algorithm = Algorithm::kLeakyBucket,
                           .rate = {10, Duration::Seconds(1)},
                           .mode = LeakyMode::kShape,
                           .max_delay = Duration::Seconds(5)}),
            "leaky_bucket shape 10/s max_delay 5s");
}

}  // namespace
}  // namespace sluice::sim
