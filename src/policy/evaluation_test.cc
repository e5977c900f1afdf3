#include "policy/evaluation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "metrics/metrics.h"
#include "sluice/clock.h"
#include "sluice/store/memory_store.h"

namespace sluice::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr Time kEvaluationStart = Time::FromUnixMicros(1'700'000'000'000'000);

// The policies of a config over a memory store, and a synchronous Evaluate
// (every limit is in process, so the verdict arrives before it returns).
class EvaluateTest : public ::testing::Test {
 protected:
  void Load(std::string_view policies) {
    absl::StatusOr<Config> config =
        ParseConfig(std::string("policies:\n") + std::string(policies), "test.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::shared_ptr<const PolicySet>> set =
        PolicySet::Create(*config, store_, nullptr, clock_, nullptr, metrics_);
    ASSERT_TRUE(set.ok()) << set.status();
    set_ = *std::move(set);
  }

  const Policy* P(std::string_view name) const { return set_->Find(name); }

  Verdict Run(const std::vector<Applied>& applied) {
    EXPECT_TRUE(InProcess(applied));
    std::optional<Verdict> out;
    Evaluate(applied, clock_.Now(), [&out](Verdict v) { out = std::move(v); });
    EXPECT_TRUE(out.has_value()) << "in-process policies answer before Evaluate returns";
    return out ? *std::move(out) : Verdict{};
  }

  // What `policy` has left for `key`, taking nothing.
  int64_t Left(std::string_view policy, std::string_view key) {
    absl::StatusOr<std::vector<Decision>> d = P(policy)->limiter().Inspect(key, clock_.Now(), 0);
    EXPECT_TRUE(d.ok());
    return d.ok() ? (*d)[0].remaining : -1;
  }

  int64_t Count(std::string_view policy, std::string_view outcome) {
    return metrics_
        .Get("sluice_decisions_total",
             {{"policy", std::string(policy)}, {"outcome", std::string(outcome)}})
        ->value();
  }

  MemoryStore store_;
  ManualClock clock_{kEvaluationStart};
  metrics::Metrics metrics_;
  std::shared_ptr<const PolicySet> set_;
};

constexpr std::string_view kTwo = R"yaml(
  - name: wide
    limits: [{algorithm: fixed_window, rate: 10/min}]
  - name: narrow
    limits: [{algorithm: fixed_window, rate: 2/min}]
)yaml";

TEST_F(EvaluateTest, AdmitsWhenEveryPolicyAdmitsAndTakesFromEach) {
  Load(kTwo);
  const std::vector<Applied> applied = {{P("wide"), "k"}, {P("narrow"), "k"}};
  const Verdict v = Run(applied);
  EXPECT_TRUE(v.allowed);
  EXPECT_TRUE(v.error.ok());
  EXPECT_THAT(v.violated, IsEmpty());
  EXPECT_TRUE(v.answers[0].took);
  EXPECT_FALSE(v.answers[0].refunded);
  EXPECT_EQ(Left("wide", "k"), 9);
  EXPECT_EQ(Left("narrow", "k"), 1);
  EXPECT_EQ(Count("wide", "allowed"), 1);
}

TEST_F(EvaluateTest, ADeniedRequestKeepsNothingFromAnyPolicy) {
  Load(kTwo);
  const std::vector<Applied> applied = {{P("wide"), "k"}, {P("narrow"), "k"}};
  ASSERT_TRUE(Run(applied).allowed);
  ASSERT_TRUE(Run(applied).allowed);
  const Verdict v = Run(applied);
  EXPECT_FALSE(v.allowed);
  EXPECT_THAT(v.violated, ElementsAre("narrow"));
  EXPECT_EQ(v.status, 429);
  // wide took, then gave back: it reports what was left before the request.
  EXPECT_TRUE(v.answers[0].refunded);
  EXPECT_EQ(v.answers[0].decision.remaining, 8);
  EXPECT_EQ(Left("wide", "k"), 8);
  EXPECT_GT(v.retry_after, Duration::Zero());
  EXPECT_THAT(v.detail, HasSubstr("retry after"));
  EXPECT_EQ(Count("narrow", "denied"), 1);
}

TEST_F(EvaluateTest, PoliciesAfterADenialAreAskedAndTakeNothing) {
  Load(kTwo);
  const std::vector<Applied> narrow_first = {{P("narrow"), "k"}, {P("wide"), "k"}};
  ASSERT_TRUE(Run(narrow_first).allowed);
  ASSERT_TRUE(Run(narrow_first).allowed);
  const Verdict v = Run(narrow_first);
  EXPECT_FALSE(v.allowed);
  EXPECT_TRUE(v.answers[1].decided);
  EXPECT_FALSE(v.answers[1].took);
  EXPECT_EQ(Left("wide", "k"), 8);
  // Both answers reach the RateLimit fields.
  std::mt19937_64 rng(1);
  FieldList headers;
  v.AppendHeaders(narrow_first, /*legacy=*/false, rng, headers);
  ASSERT_GE(headers.size(), 3u);
  EXPECT_THAT(headers[0].value, HasSubstr("\"narrow\""));
  EXPECT_THAT(headers[0].value, HasSubstr("\"wide\""));
  EXPECT_EQ(headers.back().name, "Retry-After");
}

TEST_F(EvaluateTest, AMissingKeyDeniesBeforeAnythingIsTaken) {
  Load(kTwo);
  const std::vector<Applied> applied = {{P("wide"), "k"}, {P("narrow"), std::nullopt}};
  const Verdict v = Run(applied);
  EXPECT_FALSE(v.allowed);
  EXPECT_TRUE(v.never);
  EXPECT_THAT(v.violated, ElementsAre("narrow"));
  EXPECT_THAT(v.detail, HasSubstr("lacks a key part"));
  EXPECT_FALSE(v.answers[0].decided);
  EXPECT_EQ(Left("wide", "k"), 10);
  EXPECT_EQ(Count("narrow", "missing_key"), 1);
  std::mt19937_64 rng(1);
  FieldList headers;
  v.AppendHeaders(applied, false, rng, headers);
  EXPECT_THAT(headers, IsEmpty());  // no Retry-After: waiting does not bring the key
}

TEST_F(EvaluateTest, AShadowPolicyCountsItsDenialAndNeverDenies) {
  Load(R"yaml(
  - name: trial
    shadow: true
    limits: [{algorithm: fixed_window, rate: 1/min}]
  - name: real
    limits: [{algorithm: fixed_window, rate: 10/min}]
)yaml");
  const std::vector<Applied> applied = {{P("trial"), "k"}, {P("real"), "k"}};
  ASSERT_TRUE(Run(applied).allowed);
  const Verdict v = Run(applied);
  EXPECT_TRUE(v.allowed);
  EXPECT_THAT(v.shadow_denied, ElementsAre("trial"));
  EXPECT_EQ(Count("trial", "shadow_denied"), 1);
  EXPECT_EQ(Left("real", "k"), 8);
  // Clients are not told about a trial.
  const PolicyAnswers answers = EnforcedAnswers(applied, v);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].name, "real");
}

TEST_F(EvaluateTest, ACostNoLimitCanAdmitNeverPassesAndHasNoRetryAfter) {
  Load(kTwo);
  const std::vector<Applied> applied = {{P("narrow"), "k", 5}};
  const Verdict v = Run(applied);
  EXPECT_FALSE(v.allowed);
  EXPECT_TRUE(v.never);
  EXPECT_THAT(v.detail, HasSubstr("can never pass"));
  std::mt19937_64 rng(1);
  FieldList headers;
  v.AppendHeaders(applied, false, rng, headers);
  for (const auto& [name, value] : headers) EXPECT_NE(name, "Retry-After");
}

TEST_F(EvaluateTest, AnErrorGivesBackWhatWasTaken) {
  Load(R"yaml(
  - name: open
    limits: [{algorithm: fixed_window, rate: 10/min}]
  - name: strict
    long_keys: refuse
    limits: [{algorithm: fixed_window, rate: 10/min}]
)yaml");
  const std::string long_key(2000, 'x');
  const std::vector<Applied> applied = {{P("open"), long_key}, {P("strict"), long_key}};
  const Verdict v = Run(applied);
  EXPECT_FALSE(v.error.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(v.error)) << v.error;
  EXPECT_EQ(Left("open", long_key), 10);
}

constexpr std::string_view kShapes = R"yaml(
  - name: plain
    limits: [{algorithm: fixed_window, rate: 10/min}]
  - name: queue-a
    limits: [{algorithm: leaky_bucket, mode: shape, rate: 1/s, max_delay: 1s}]
  - name: queue-b
    limits: [{algorithm: leaky_bucket, mode: shape, rate: 1/s, max_delay: 3s}]
)yaml";

TEST_F(EvaluateTest, ShapingPoliciesDecideLastAndTakeOnlyWhenAllAdmit) {
  Load(kShapes);
  const std::vector<Applied> applied = {
      {P("queue-a"), "k"}, {P("plain"), "k"}, {P("queue-b"), "k"}};
  Verdict v = Run(applied);
  ASSERT_TRUE(v.allowed);
  EXPECT_THAT(v.order, ElementsAre(1, 0, 2));  // plain first, the queues after
  // queue-a (1 s of delay at most) fills at its second request; queue-b
  // (3 s) would still admit, but takes no slot for a request queue-a denies.
  v = Run(applied);
  ASSERT_TRUE(v.allowed);
  EXPECT_EQ(v.delay, Duration::Seconds(1));
  v = Run(applied);
  EXPECT_FALSE(v.allowed);
  EXPECT_THAT(v.violated, ElementsAre("queue-a"));
  EXPECT_FALSE(v.answers[2].took);
  EXPECT_EQ(Left("plain", "k"), 8);
  // queue-b holds two slots, not three: the next request waits 2 s there.
  const Verdict b = Run({{P("queue-b"), "k"}});
  EXPECT_TRUE(b.allowed);
  EXPECT_EQ(b.delay, Duration::Seconds(2));
}

}  // namespace
}  // namespace sluice::policy
