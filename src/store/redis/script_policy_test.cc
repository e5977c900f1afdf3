// Several limits in one call: the script's all-or-nothing inside Redis
// answers exactly like sluice::Limiter over the memory store (decide in
// order, refund the earlier limits on a denial, check the later ones), once
// its per-limit decisions are merged by MergeDecisions.
//
// The traces are monotonic: with a clock that steps back, Limiter's
// decide-then-refund is not exactly "nothing happened" (a token bucket keeps
// the later time it saw), while the script writes nothing at all.
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"
#include "sluice/clock.h"
#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"
#include "store/redis/script_test_support.h"

namespace sluice::redis {
namespace {

using conformance::DebugString;
using conformance::SameDecision;
using conformance::TraceRng;

struct Policy {
  std::string name;
  std::vector<LimitOptions> limits;
};

std::ostream& operator<<(std::ostream& os, const Policy& p) { return os << p.name; }

LimitOptions L(Algorithm algorithm, std::string_view rate, int64_t burst = 0) {
  LimitOptions options;
  options.algorithm = algorithm;
  options.rate = *ParseRate(rate);
  options.burst = burst;
  return options;
}

std::vector<Policy> Policies() {
  LimitOptions shape = L(Algorithm::kLeakyBucket, "10/s");
  shape.mode = LeakyMode::kShape;
  shape.queue = 5;
  return {
      {"bucket_and_window",
       {L(Algorithm::kTokenBucket, "5/h"), L(Algorithm::kFixedWindow, "3/min")}},
      // The shape limit is listed first; both sides decide it last.
      {"shape_gcra_sliding_window",
       {shape, L(Algorithm::kGcra, "100/s", 20), L(Algorithm::kSlidingWindow, "40/5s")}},
      {"log_police_bucket",
       {L(Algorithm::kSlidingLog, "7/min"), L(Algorithm::kLeakyBucket, "3/250ms"),
        L(Algorithm::kTokenBucket, "1/s", 3)}},
  };
}

class ScriptPolicyTest : public RedisTest, public ::testing::WithParamInterface<Policy> {};

TEST_P(ScriptPolicyTest, MatchesLimiter) {
  const Policy& policy = GetParam();
  ManualClock clock(conformance::kTraceOrigin);
  MemoryStore store;
  absl::StatusOr<std::unique_ptr<Limiter>> limiter =
      Limiter::Create(store, {.name = policy.name, .limits = policy.limits, .clock = &clock});
  ASSERT_TRUE(limiter.ok()) << limiter.status();

  // The script's limits in decision order (shape last), as a store sends them.
  std::vector<size_t> order;
  for (size_t i = 0; i < (*limiter)->limits().size(); ++i) {
    if (!IsShape((*limiter)->limits()[i])) order.push_back(i);
  }
  for (size_t i = 0; i < (*limiter)->limits().size(); ++i) {
    if (IsShape((*limiter)->limits()[i])) order.push_back(i);
  }
  std::vector<std::string> key_names;
  std::vector<std::string> params;
  for (size_t i : order) {
    ASSERT_TRUE(ValidateForRedis((*limiter)->limits()[i]).ok());
    key_names.push_back("{user-1}:" + policy.name + ":" + std::to_string(i));
    params.push_back(LimitParams((*limiter)->limits()[i]));
  }
  const std::vector<std::string_view> keys(key_names.begin(), key_names.end());

  // The fastest limit sets the time scale of the trace.
  Rate fastest = policy.limits[0].rate;
  for (const LimitOptions& l : policy.limits) {
    if (l.rate.period.micros() / l.rate.limit < fastest.period.micros() / fastest.limit) {
      fastest = l.rate;
    }
  }
  conformance::TraceOptions options;
  options.rate = fastest;
  options.capacity = 4;
  TraceRng rng(7);
  std::deque<std::pair<Time, int64_t>> taken;
  int64_t now = conformance::kTraceOrigin.unix_micros();
  int allowed = 0;
  int denied = 0;
  for (int step = 0; step < 1500; ++step) {
    now = conformance::NextTime(rng, now, options);
    const Time at = Time::FromUnixMicros(now);
    clock.Set(at);
    const int64_t kind = rng.Uniform(0, 99);
    SCOPED_TRACE(::testing::Message() << "step " << step << " at " << now << "us");
    if (kind < 10 && !taken.empty()) {
      const auto [taken_at, cost] = taken.front();
      taken.pop_front();
      ASSERT_TRUE((*limiter)->Refund("k", taken_at, cost).ok());
      absl::StatusOr<ScriptResult> r = Run(
          {.op = ScriptOp::kRefund, .now = at, .cost = cost, .taken_at = taken_at}, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      continue;
    }
    const int64_t cost = conformance::NextCost(rng, options.capacity);
    const bool check = kind < 20;
    absl::StatusOr<PolicyDecision> want =
        check ? (*limiter)->Check("k", {.cost = cost}) : (*limiter)->AcquireAt("k", at, cost);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<ScriptResult> got =
        Run({.op = check ? ScriptOp::kCheck : ScriptOp::kDecide, .now = at, .cost = cost}, keys,
            params);
    ASSERT_TRUE(got.ok()) << got.status();
    const MergedDecision merged = MergeDecisions(got->decisions);
    ASSERT_TRUE(SameDecision(merged.decision, *want))
        << (check ? "check" : "decide") << " cost " << cost;
    ASSERT_EQ(order[merged.index], want->limit_index) << DebugString(merged.decision);
    if (!check && want->allowed && cost > 0) {
      taken.emplace_back(at, cost);
      if (taken.size() > 4) taken.pop_front();
    }
    (want->allowed ? allowed : denied) += check ? 0 : 1;
  }
  // The trace reaches both outcomes, or it proves little.
  EXPECT_GT(allowed, 100);
  EXPECT_GT(denied, 100);
}

INSTANTIATE_TEST_SUITE_P(Policies, ScriptPolicyTest, ::testing::ValuesIn(Policies()),
                         [](const ::testing::TestParamInfo<Policy>& info) {
                           return info.param.name;
                         });

// All-or-nothing, spelled out: a denial by the second limit leaves the
// first limit's key exactly as it was.
TEST_F(RedisTest, ADenialWritesNoLimit) {
  const std::string params[] = {LimitParams(*MakeLimit(L(Algorithm::kTokenBucket, "10/s"))),
                                LimitParams(*MakeLimit(L(Algorithm::kFixedWindow, "1/min")))};
  const std::string_view keys[] = {"{u}:bucket", "{u}:window"};
  const Time t = conformance::kTraceOrigin;
  ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .now = t, .cost = 1}, keys, params).ok());
  const std::string bucket_before(Text(*Command({"GET", "{u}:bucket"})));
  const std::string window_before(Text(*Command({"GET", "{u}:window"})));
  absl::StatusOr<ScriptResult> r =
      Run({.op = ScriptOp::kDecide, .now = t + Duration::Seconds(1), .cost = 1}, keys, params);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->decisions[0].allowed);
  EXPECT_FALSE(r->decisions[1].allowed);
  EXPECT_EQ(Text(*Command({"GET", "{u}:bucket"})), bucket_before);
  EXPECT_EQ(Text(*Command({"GET", "{u}:window"})), window_before);
  const MergedDecision merged = MergeDecisions(r->decisions);
  EXPECT_EQ(merged.index, 1u);
  EXPECT_EQ(merged.decision.retry_after, Duration::Seconds(59));
}

TEST(MergeDecisionsTest, ReportsTheLongestWaitWhenDeniedAndTheLeastRemainingWhenAllowed) {
  Decision a{.allowed = true, .limit = 10, .remaining = 5, .delay = Duration::Millis(3)};
  Decision b{.allowed = true, .limit = 4, .remaining = 2};
  Decision c{.allowed = true, .limit = 9, .remaining = 2};
  MergedDecision m = MergeDecisions(std::vector<Decision>{a, b, c});
  EXPECT_EQ(m.index, 1u);  // least remaining, the first of equals
  EXPECT_EQ(m.decision.delay, Duration::Millis(3));
  Decision no1{.allowed = false, .limit = 1, .retry_after = Duration::Seconds(2)};
  Decision no2{.allowed = false, .limit = 2, .retry_after = Duration::Seconds(2)};
  Decision no3{.allowed = false, .limit = 3, .retry_after = Duration::Seconds(9)};
  m = MergeDecisions(std::vector<Decision>{a, no1, no2});
  EXPECT_EQ(m.index, 1u);  // a later denial replaces it only when strictly longer
  EXPECT_EQ(m.decision.delay, Duration::Zero());
  m = MergeDecisions(std::vector<Decision>{no1, a, no3});
  EXPECT_EQ(m.index, 2u);
}

}  // namespace
}  // namespace sluice::redis
