#include "sim/scenario_file.h"

#include <cstdio>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::sim {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(std::string_view yaml) {
  absl::StatusOr<Scenario> s = ParseScenario(yaml, "storm.yaml", "storm");
  EXPECT_FALSE(s.ok());
  return s.ok() ? "" : std::string(s.status().message());
}

TEST(SimScenarioFile, ReadsEveryPart) {
  absl::StatusOr<Scenario> s = ParseScenario(R"(
name: mine
description: a test
duration: 5m
clock_start: 59m
seed: 42
instances: 3
balance: sticky
downstream: {capacity: 40/s, queue: 100}
contract: 300/min
clients:
  - name: users
    count: 400
    key: global
    retry: {policy: retry_after, jitter: 2s, max_attempts: 5}
    traffic:
      - {burst: 400, at: 10s, spread: 1s}
      - {poisson: 10/s, from: 1m, until: 2m}
  - name: bots
    retry: {policy: backoff, base: 500ms, cap: 10s}
    traffic:
      - {constant: 1/s}
      - {diurnal: {low: 1/min, high: 10/min, peak_at: 2m, cycle: 4m}}
limiters:
  - {algorithm: fixed_window, rate: 40/min, retry_after_jitter: 0s}
  - name: layered
    scope: global
    retry: never
    limits:
      - {algorithm: token_bucket, rate: 40/s, burst: 80}
      - {algorithm: sliding_window, limit: 300, period: 1m}
)",
                                             "f.yaml", "f");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "mine");
  EXPECT_EQ(s->duration, Duration::Minutes(5));
  EXPECT_EQ(s->clock_start, Duration::Minutes(59));
  EXPECT_EQ(s->seed, 42u);
  EXPECT_EQ(s->instances, 3);
  EXPECT_EQ(s->balance, Balance::kSticky);
  ASSERT_TRUE(s->downstream.has_value());
  EXPECT_EQ(s->downstream->capacity, (Rate{40, Duration::Seconds(1)}));
  EXPECT_EQ(s->downstream->queue, 100);
  ASSERT_EQ(s->groups.size(), 2u);
  const ClientGroup& users = s->groups[0];
  EXPECT_EQ(users.clients, 400);
  EXPECT_EQ(users.key, KeyMode::kGlobal);
  EXPECT_EQ(users.retry.kind, RetryKind::kRetryAfter);
  EXPECT_EQ(users.retry.jitter, Duration::Seconds(2));
  EXPECT_EQ(users.retry.max_attempts, 5);
  ASSERT_EQ(users.traffic.size(), 2u);
  EXPECT_EQ(users.traffic[0].kind, ArrivalKind::kBurst);
  EXPECT_EQ(users.traffic[0].count, 400);
  EXPECT_EQ(users.traffic[0].from, Duration::Seconds(10));
  EXPECT_EQ(users.traffic[1].kind, ArrivalKind::kPoisson);
  EXPECT_EQ(users.traffic[1].until, Duration::Minutes(2));
  const ClientGroup& bots = s->groups[1];
  EXPECT_EQ(bots.name, "bots");
  EXPECT_EQ(bots.key, KeyMode::kClient);
  EXPECT_EQ(bots.retry.kind, RetryKind::kBackoff);
  EXPECT_EQ(bots.retry.base, Duration::Millis(500));
  EXPECT_EQ(bots.traffic[0].until, Duration::Minutes(5));  // default: the whole run
  EXPECT_EQ(bots.traffic[1].kind, ArrivalKind::kDiurnal);
  EXPECT_EQ(bots.traffic[1].cycle, Duration::Minutes(4));
  ASSERT_EQ(s->limiters.size(), 2u);
  EXPECT_EQ(s->limiters[0].name, "fixed_window 40/min");  // named after its limit
  EXPECT_EQ(s->limiters[0].retry_after_jitter, Duration::Zero());
  EXPECT_EQ(s->limiters[1].scope, StateScope::kShared);
  ASSERT_TRUE(s->limiters[1].retry.has_value());
  EXPECT_EQ(s->limiters[1].retry->kind, RetryKind::kNever);
  ASSERT_EQ(s->limiters[1].limits.size(), 2u);
  EXPECT_EQ(s->limiters[1].limits[1].rate, (Rate{300, Duration::Minutes(1)}));
  EXPECT_TRUE(s->warnings.empty());
}

// `scope: shared` was this file's word for the serve config's global: it
// still reads, as global, with a warning naming the place.
TEST(SimScenarioFile, ScopeSharedIsADeprecatedAliasOfGlobal) {
  absl::StatusOr<Scenario> s = ParseScenario(
      "duration: 1m\nclients: [{traffic: [{burst: 1}]}]\nlimiters:\n"
      "  - {algorithm: gcra, rate: 1/s, scope: shared}\n",
      "storm.yaml", "storm");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->limiters[0].scope, StateScope::kShared);
  EXPECT_THAT(s->warnings,
              testing::ElementsAre("storm.yaml:4: limiters[0].scope: \"shared\" is deprecated: "
                                   "write global (the same meaning, as in the serve config)"));
}

// Errors name the file, the line and the key.
TEST(SimScenarioFile, AQuoteNeverClosedIsRefused) {
  EXPECT_EQ(ErrorOf("duration: 1m\nname: \"storm\nclients: []\n"),
            "storm.yaml:2:7: a quoted value starts here and its \" is never closed");
}

TEST(SimScenarioFile, UnknownKeyNamesFileLineAndKey) {
  EXPECT_EQ(
      ErrorOf("duration: 1m\nclients:\n  - name: a\n    trafic: []\n"),
      "storm.yaml:4: clients[0].trafic: unknown key (expected one of: name, count, key, retry, "
      "traffic)");
}

TEST(SimScenarioFile, ServiceTimesAndConcurrencyLimits) {
  const std::string tail =
      "clients: [{traffic: [{burst: 1}]}]\nlimiters: [{algorithm: concurrency, limit: 3}]\n";
  absl::StatusOr<Scenario> s =
      ParseScenario("duration: 1m\nservice_time: {uniform: [10ms, 30ms]}\n" + tail, "s.yaml", "s");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->service_time.has_value());
  EXPECT_EQ(s->service_time->kind, ServiceTime::Kind::kUniform);
  EXPECT_EQ(s->service_time->b, Duration::Millis(30));
  EXPECT_EQ(s->limiters[0].limits[0].algorithm, Algorithm::kConcurrency);
  EXPECT_THAT(ErrorOf("duration: 1m\n" + tail),
              HasSubstr("a concurrency limit needs requests that take time"));
  EXPECT_THAT(ErrorOf("duration: 1m\ndownstream: {capacity: 5/s}\nservice_time: 1s\n" + tail),
              HasSubstr("give downstream (a server of a capacity) or service_time, not both"));
  EXPECT_THAT(ErrorOf("duration: 1m\nservice_time: {uniform: [30ms, 10ms]}\n" + tail),
              HasSubstr("HIGH must not be below LOW"));
  EXPECT_THAT(ErrorOf("duration: 1m\nservice_time: {exponential: 1s, constant: 1s}\n" + tail),
              HasSubstr("one of constant, exponential or uniform"));
  EXPECT_THAT(ErrorOf("duration: 1m\nservice_time: 2h\n" + tail), HasSubstr("service_time"));
}

TEST(SimScenarioFile, BadValuesNameFileLineAndKey) {
  const std::string base = "duration: 1m\nclients: [{traffic: [{burst: 1}]}]\n";
  EXPECT_THAT(ErrorOf(base + "limiters:\n  - {algorithm: gcra, rate: 10/fortnight}\n"),
              HasSubstr("storm.yaml:4: limiters[0].rate: rate \"10/fortnight\": period "
                        "\"fortnight\": unknown unit"));
  EXPECT_THAT(ErrorOf(base + "limiters:\n  - {algorithm: bucket, rate: 1/s}\n"),
              HasSubstr("storm.yaml:4: limiters[0].algorithm: unknown algorithm \"bucket\""));
  EXPECT_THAT(ErrorOf(base + "limiters:\n  - {algorithm: fixed_window, rate: 1/s, mode: shape}\n"),
              HasSubstr("storm.yaml:4: limiters[0].mode: mode applies only to leaky_bucket"));
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients:\n  - traffic:\n      - {poisson: fast}\nlimiters: []\n"),
      HasSubstr("storm.yaml:4: clients[0].traffic[0].poisson:"));
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients:\n  - traffic: [{burst: 1, from: 2s}]\nlimiters: []\n"),
      HasSubstr("storm.yaml:3: clients[0].traffic[0].from: does not apply to burst"));
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients:\n  - retry: {policy: fixed}\n    traffic: [{burst: 1}]\n"),
      HasSubstr("storm.yaml:3: clients[0].retry.delay: required for policy fixed"));
  EXPECT_THAT(ErrorOf("duration: 1m\nclients:\n  - retry: {policy: never, base: 1s}\n    traffic: "
                      "[{burst: 1}]\n"),
              HasSubstr("storm.yaml:3: clients[0].retry.base: does not apply to policy never"));
  EXPECT_THAT(ErrorOf(base + "limiters:\n  - {algorithm: gcra, rate: 1/s, scope: regional}\n"),
              HasSubstr("storm.yaml:4: limiters[0].scope: expected one of: local, global; got "
                        "\"regional\""));
}

TEST(SimScenarioFile, MissingKeysAreNamed) {
  EXPECT_THAT(ErrorOf("clients: []\n"), HasSubstr("storm.yaml:1: duration: required"));
  EXPECT_THAT(ErrorOf("duration: 1m\nclients:\n  - name: a\n"),
              HasSubstr("storm.yaml:3: clients[0].traffic: required"));
  EXPECT_THAT(ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1}]}]\n"),
              HasSubstr("limiters: required"));
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1}]}]\nlimiters:\n  - {rate: 1/s}\n"),
      HasSubstr("storm.yaml:4: limiters[0].algorithm: required"));
}

TEST(SimScenarioFile, DuplicatesAndConflictsAreErrors) {
  EXPECT_EQ(ErrorOf("duration: 1m\nduration: 2m\n"),
            "storm.yaml:2: duration: duplicate key (first at line 1)");
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1, poisson: 1/s}]}]\nlimiters: []\n"),
      HasSubstr("one pattern per entry"));
  EXPECT_THAT(ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1}]}]\nlimiters:\n  - "
                      "{algorithm: gcra, rate: 1/s}\n"
                      "  - {algorithm: gcra, rate: 1/s}\n"),
              HasSubstr("storm.yaml:5: limiters[1]: a second limiter named \"gcra 1/s\""));
  EXPECT_THAT(
      ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1, at: 2m}]}]\n"),
      HasSubstr("storm.yaml:2: clients[0].traffic[0].at: is at or after the scenario's end"));
}

TEST(SimScenarioFile, YamlSyntaxErrorsHaveALine) {
  EXPECT_THAT(ErrorOf("duration: 1m\nclients: [\n  {name: a\n"), HasSubstr("storm.yaml:"));
  EXPECT_THAT(ErrorOf("- a list\n"), HasSubstr("storm.yaml:1: expected a scenario"));
}

TEST(SimScenarioFile, ASecondDocumentIsRefused) {
  EXPECT_EQ(ErrorOf("duration: 1m\n---\nduration: 2m\n"),
            "storm.yaml:3: a scenario file holds one YAML document; a second one starts here");
}

// Names, durations and integers follow the rules and words of the serve
// config (docs/configuration.md, "Bounds").
TEST(SimScenarioFile, BoundsAndWordsAreTheConfigs) {
  const std::string limiters = "limiters: [{algorithm: gcra, rate: 1/s}]\n";
  const std::string name128(128, 'n');
  absl::StatusOr<Scenario> s = ParseScenario(
      "name: " + name128 + "\nduration: 1m\nclients: [{traffic: [{burst: 1}]}]\n" + limiters,
      "storm.yaml", "storm");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, name128);
  EXPECT_EQ(ErrorOf("name: " + name128 + "n\nduration: 1m\n"),
            "storm.yaml:1: name: name is 129 characters long, the most is 128");
  EXPECT_EQ(ErrorOf("name: \"\"\nduration: 1m\n"), "storm.yaml:1: name: must not be empty");
  EXPECT_EQ(ErrorOf("duration: 3d\n"), "storm.yaml:1: duration: must be at most 2d, got 3d");
  EXPECT_EQ(ErrorOf("duration: 1m\nclients:\n  - retry: {policy: fixed, delay: 0s}\n"),
            "storm.yaml:3: clients[0].retry.delay: must be longer than 0, got 0s");
  EXPECT_EQ(ErrorOf("duration: 1m\nseed: -1\n"), "storm.yaml:2: seed: must be at least 0, got -1");
  EXPECT_EQ(ErrorOf("duration: 1m\nseed: 99999999999999999999\n"),
            "storm.yaml:2: seed: \"99999999999999999999\" is too large");
  EXPECT_EQ(ErrorOf("duration: 1m\nclients: {name: a}\n"),
            "storm.yaml:2: clients: expected a list of client groups, got a map");
  EXPECT_EQ(ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1}]}]\n"
                    "limiters:\n  - {algorithm: token_bucket, rate: 1/s, burst: 1099511627777}\n"),
            "storm.yaml:4: limiters[0].burst: must be from 1 to 1099511627776, got 1099511627777");
  EXPECT_EQ(ErrorOf("duration: 1m\nclients: [{traffic: [{burst: 1}]}]\n"
                    "limiters:\n  - {algorithm: gcra, limit: 5}\n"),
            "storm.yaml:4: limiters[0].period: required with limit");
}

TEST(SimScenarioFile, LoadsAFileAndNamesItInErrors) {
  const std::string path = testing::TempDir() + "/bad_scenario.yaml";
  {
    std::ofstream out(path);
    out << "duration: 1m\nclients:\n  - {count: 0, traffic: [{burst: 1}]}\n";
  }
  absl::StatusOr<Scenario> s = LoadScenarioFile(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr(path + ":3: clients[0].count: must be from 1 to"));
  EXPECT_TRUE(absl::IsNotFound(LoadScenarioFile(path + ".missing").status()));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sluice::sim
