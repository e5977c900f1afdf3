// Matching request descriptors against the envoy rules, and the state keys,
// without gRPC: envoyproxy/ratelimit's semantics, case by case.
#include "policy/envoy_rules.h"

#include <set>

#include <gtest/gtest.h>

#include "sluice/clock.h"
#include "sluice/store/memory_store.h"

namespace sluice::policy {
namespace {

class RulesTest : public ::testing::Test {
 protected:
  std::shared_ptr<const RuleSet> Build(std::string_view yaml, const RuleSet* previous = nullptr) {
    absl::StatusOr<EnvoyDomain> domain = ParseEnvoyDomain(yaml, "rl.yaml");
    EXPECT_TRUE(domain.ok()) << domain.status();
    EnvoyConfig config;
    config.domains.push_back(*domain);
    absl::StatusOr<std::shared_ptr<const RuleSet>> set = RuleSet::Create(
        &config, {.local = &store_, .clock = &clock_, .metrics = &metrics_}, previous);
    EXPECT_TRUE(set.ok()) << set.status();
    return *set;
  }
  static std::string NameOf(const Rule* rule) {
    return rule == nullptr ? "(none)" : rule->stats_key;
  }

  ManualClock clock_{Time::FromUnixMicros(1'700'006'400'000'000)};
  MemoryStore store_;
  metrics::Metrics metrics_;
};

constexpr std::string_view kRules = R"(
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: k
    value: nolimit
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: outer
    descriptors:
      - key: inner
        value: x
        rate_limit: {unit: second, requests_per_unit: 6}
)";

TEST_F(RulesTest, MostSpecificNodeWins) {
  std::shared_ptr<const RuleSet> set = Build(kRules);
  const DomainRules* d = set->Find("d");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(set->Find("other"), nullptr);
  auto match = [&](std::vector<Entry> entries) { return NameOf(d->Match(entries)); };
  EXPECT_EQ(match({{"k", "exact"}}), "d.k_exact");
  EXPECT_EQ(match({{"k", "anything"}}), "d.k_a*");  // wildcards before any value
  EXPECT_EQ(match({{"k", "abc"}}), "d.k_ab*");      // the first wildcard in file order
  EXPECT_EQ(match({{"k", "zzz"}}), "d.k");
  EXPECT_EQ(match({{"other", "zzz"}}), "(none)");
}

TEST(WildcardMatch, StarAnywhereStandsForAnyRun) {
  // envoyproxy/ratelimit's own examples: a mid-value `*`, and several.
  for (std::string_view v : {"barab", "barb", "bar123b"}) {
    EXPECT_TRUE(DomainRules::WildcardMatch("bar*b", v)) << v;
  }
  EXPECT_FALSE(DomainRules::WildcardMatch("bar*b", "bar"));
  EXPECT_FALSE(DomainRules::WildcardMatch("bar*b", "barbx"));
  EXPECT_FALSE(DomainRules::WildcardMatch("bar*b", "xbarb"));
  for (std::string_view v : {"foo123bar456baz", "foobarbaz", "foobarbarbaz"}) {
    EXPECT_TRUE(DomainRules::WildcardMatch("foo*bar*baz", v)) << v;
  }
  EXPECT_FALSE(DomainRules::WildcardMatch("foo*bar*baz", "foobaz"));
  EXPECT_FALSE(DomainRules::WildcardMatch("foo*bar*baz", "foo123bar456ba"));
  EXPECT_TRUE(DomainRules::WildcardMatch("*.example.com", "api.example.com"));
  EXPECT_FALSE(DomainRules::WildcardMatch("*.example.com", "example.com"));
  EXPECT_TRUE(DomainRules::WildcardMatch("foo*", "foo"));
  EXPECT_TRUE(DomainRules::WildcardMatch("*", ""));
  EXPECT_TRUE(DomainRules::WildcardMatch("a**b", "ab"));
  EXPECT_FALSE(DomainRules::WildcardMatch("", "a"));
  // A long value against a pattern that backtracks: still answered.
  EXPECT_FALSE(DomainRules::WildcardMatch("*a*a*a*a*b", std::string(100'000, 'a')));
}

TEST_F(RulesTest, MidValueWildcardsLimitWhatTheyMatchFirstInFileOrder) {
  // Regression: a `*` inside a value loaded and then matched only itself,
  // so a migrated rule limited nothing.
  std::shared_ptr<const RuleSet> set = Build(R"(
domain: w
descriptors:
  - key: k
    value: bar*b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*bar*baz
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foobarbaz
    rate_limit: {unit: second, requests_per_unit: 4}
)");
  const DomainRules* d = set->Find("w");
  ASSERT_NE(d, nullptr);
  auto match = [&](std::vector<Entry> entries) { return NameOf(d->Match(entries)); };
  EXPECT_EQ(match({{"k", "bar123b"}}), "w.k_bar*b");
  EXPECT_EQ(match({{"k", "barb"}}), "w.k_bar*b");
  EXPECT_EQ(match({{"k", "foo123bar456baz"}}), "w.k_foo*bar*baz");  // before foo*: file order
  EXPECT_EQ(match({{"k", "foo1"}}), "w.k_foo*");
  EXPECT_EQ(match({{"k", "foobarbaz"}}), "w.k_foobarbaz");  // an exact value before any wildcard
  EXPECT_EQ(match({{"k", "bar"}}), "(none)");
}

TEST_F(RulesTest, DepthMustMatchAndSpecificNodesDoNotFallBack) {
  std::shared_ptr<const RuleSet> set = Build(kRules);
  const DomainRules* d = set->Find("d");
  auto match = [&](std::vector<Entry> entries) { return NameOf(d->Match(entries)); };
  EXPECT_EQ(match({{"k", "zzz"}, {"more", "1"}}), "(none)");  // deeper than the rule
  EXPECT_EQ(match({{"outer", "o"}}), "(none)");               // the node has no limit
  EXPECT_EQ(match({{"outer", "o"}, {"inner", "x"}}), "d.outer.inner_x");
  EXPECT_EQ(match({{"outer", "o"}, {"inner", "y"}}), "(none)");
  // k=nolimit exists without a limit: it hides the any-value rule of k.
  EXPECT_EQ(match({{"k", "nolimit"}}), "(none)");
  EXPECT_EQ(match({{"k", "nolimit"}, {"sub", "s"}}), "d.k_nolimit.sub");
}

TEST_F(RulesTest, StateKeysAreDistinctForDistinctEntryLists) {
  const std::vector<Entry> a = {{"k", "a|b"}};
  const std::vector<Entry> b = {{"k", "a"}, {"b", ""}};
  const std::vector<Entry> c = {{"k=a", "b"}};
  const std::vector<Entry> e = {{"k", "a=b"}};
  const std::set<std::string> keys = {StateKey("d", a), StateKey("d", b), StateKey("d", c),
                                      StateKey("d", e), StateKey("d|k=a", {})};
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_EQ(StateKey("d", a), "d|k=a\\|b");
  EXPECT_EQ(StateKeyLength("d", a), StateKey("d", a).size());
  EXPECT_EQ(StateKeyLength("d|x", c), StateKey("d|x", c).size());
}

TEST_F(RulesTest, AShareThresholdWildcardPutsItsPatternInTheKey) {
  std::shared_ptr<const RuleSet> set = Build(R"(
domain: d
descriptors:
  - key: k
    value: "f*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "g*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "fixed"
    rate_limit: {unit: second, requests_per_unit: 1}
)");
  const DomainRules* d = set->Find("d");
  ASSERT_NE(d, nullptr);
  const auto key = [&](std::string_view value) {
    std::vector<Entry> entries = {{"k", value}};
    EXPECT_NE(d->Match(entries), nullptr) << value;
    return StateKey("d", entries);
  };
  EXPECT_EQ(key("foo"), key("far"));
  EXPECT_EQ(key("foo"), StateKey("d", std::vector<Entry>{{"k", "f*"}}));
  EXPECT_NE(key("gap"), key("gum"));    // no share_threshold: a value each
  EXPECT_NE(key("fixed"), key("foo"));  // an exact value is matched first, and keyed by it
}

TEST_F(RulesTest, ARebuildKeepsLimitersOfUnchangedRules) {
  std::shared_ptr<const RuleSet> first = Build(kRules);
  std::string changed(kRules);
  changed.replace(changed.find("requests_per_unit: 2"), 20, "requests_per_unit: 9");
  std::shared_ptr<const RuleSet> second = Build(changed, first.get());
  std::vector<Entry> any = {{"k", "zzz"}};
  std::vector<Entry> exact = {{"k", "exact"}};
  EXPECT_EQ(first->Find("d")->Match(any)->policy.shared_limiter(),
            second->Find("d")->Match(any)->policy.shared_limiter());
  EXPECT_NE(first->Find("d")->Match(exact)->policy.shared_limiter(),
            second->Find("d")->Match(exact)->policy.shared_limiter());
  EXPECT_EQ(second->Find("d")->Match(exact)->requests_per_unit, 9u);
}

TEST_F(RulesTest, OverridesAreSharedAndBounded) {
  Overrides overrides({.local = &store_, .clock = &clock_, .metrics = &metrics_});
  absl::StatusOr<const Rule*> a = overrides.Get(10, EnvoyUnit::kMinute);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*overrides.Get(10, EnvoyUnit::kMinute), *a);
  EXPECT_EQ((*a)->stats_key, "override_10_per_minute");
  EXPECT_EQ((*overrides.Get(0, EnvoyUnit::kSecond))->kind, Rule::Kind::kDenyAll);
  EXPECT_EQ(overrides.Get(1, EnvoyUnit::kUnknown).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (uint32_t n = 100; n < 100 + Overrides::kMaxOverrides; ++n)
    (void)overrides.Get(n, EnvoyUnit::kHour);
  EXPECT_EQ(overrides.Get(99999, EnvoyUnit::kHour).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(overrides.Get(10, EnvoyUnit::kMinute).ok());  // known ones still answer
}

}  // namespace
}  // namespace sluice::policy
