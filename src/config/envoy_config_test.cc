// The envoyproxy/ratelimit YAML reader: what each key maps to, and that
// every mistake is reported with its file, line and key.
#include "sluice/envoy_config.h"

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config.h"

namespace sluice {
namespace {

std::string ErrorOf(std::string_view yaml, EnvoyParseOptions options = {}) {
  absl::StatusOr<EnvoyDomain> d = ParseEnvoyDomain(yaml, "rl.yaml", options);
  if (d.ok()) return "(parsed)";
  return std::string(d.status().message());
}

std::string ConfigErrorOf(std::string_view yaml, const std::string& source = "t.yaml") {
  absl::StatusOr<Config> c = ParseConfig(yaml, source);
  if (c.ok()) return "(parsed)";
  return std::string(c.status().message());
}

const EnvoyDescriptor& At(const std::vector<EnvoyDescriptor>& level, size_t i) {
  EXPECT_LT(i, level.size());
  return level.at(i);
}

TEST(EnvoyConfig, LoadsTheExampleFilesInOrder) {
  absl::StatusOr<Config> config = LoadConfigFile(SLUICE_SOURCE_DIR "/tests/envoy/sluice.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->grpc.has_value());
  EXPECT_EQ(config->grpc->listen, (HostPort{"127.0.0.1", 0}));
  ASSERT_NE(config->envoy, nullptr);
  const std::vector<EnvoyDomain>& domains = config->envoy->domains;
  ASSERT_EQ(domains.size(), 4u);
  EXPECT_EQ(domains[0].domain, "inline");  // envoy: first, then envoy_files in order
  EXPECT_EQ(domains[1].domain, "edge");
  EXPECT_EQ(domains[2].domain, "api");
  EXPECT_EQ(domains[3].domain, "ext");
  EXPECT_EQ(domains[1].source, SLUICE_SOURCE_DIR "/tests/envoy/edge.yaml");
}

TEST(EnvoyConfig, TheExampleLoads) {
  absl::StatusOr<Config> config = LoadConfigFile(SLUICE_SOURCE_DIR "/examples/envoy.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->grpc->listen, (HostPort{"127.0.0.1", 8081}));
  ASSERT_EQ(config->envoy->domains.size(), 2u);
  EXPECT_EQ(config->envoy->domains[0].domain, "edge");
  EXPECT_EQ(config->envoy->domains[1].domain, "api");
  EXPECT_EQ(config->envoy->domains[1].source, SLUICE_SOURCE_DIR "/examples/envoy/api.yaml");
}

TEST(EnvoyConfig, UnitAndRequestsPerUnitMapToAnAlignedFixedWindow) {
  absl::StatusOr<EnvoyDomain> d = ParseEnvoyDomain(R"(
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: Minute, requests_per_unit: 3}
)",
                                                   "rl.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  const EnvoyDescriptor& r = At(d->descriptors, 0);
  EXPECT_EQ(r.key, "remote_address");
  EXPECT_FALSE(r.value.has_value());
  ASSERT_TRUE(r.rate_limit.has_value());
  EXPECT_EQ(r.rate_limit->unit, EnvoyUnit::kMinute);
  EXPECT_EQ(r.rate_limit->requests_per_unit, 3u);
  EXPECT_EQ(r.rate_limit->limit.options.algorithm, Algorithm::kFixedWindow);
  EXPECT_EQ(r.rate_limit->limit.options.rate, (Rate{3, Duration::Minutes(1)}));
  EXPECT_EQ(r.rate_limit->limit.scope, Scope::kLocal);
  EXPECT_EQ(r.line, 4);
}

TEST(EnvoyConfig, EveryUnitHasEnvoyRateLimitsLength) {
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kSecond), Duration::Seconds(1));
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kHour), Duration::Hours(1));
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kDay), Duration::Days(1));
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kWeek), Duration::Days(7));
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kMonth), Duration::Days(30));
  EXPECT_EQ(EnvoyUnitLength(EnvoyUnit::kYear), Duration::Days(365));
  absl::StatusOr<EnvoyDomain> d = ParseEnvoyDomain(
      "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: year, requests_per_unit: 7}}\n",
      "rl.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->descriptors[0].rate_limit->limit.options.rate.period, Duration::Days(365));
}

TEST(EnvoyConfig, ZeroUnlimitedShadowNamesAndReplaces) {
  absl::StatusOr<Config> config = LoadConfigFile(SLUICE_SOURCE_DIR "/tests/envoy/sluice.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  const EnvoyDomain& edge = config->envoy->domains[1];
  EXPECT_EQ(At(edge.descriptors, 1).value, "50.0.0.5");
  EXPECT_TRUE(At(edge.descriptors, 1).rate_limit->deny_all);
  EXPECT_TRUE(At(edge.descriptors, 2).rate_limit->unlimited);
  const EnvoyDescriptor& login = At(edge.descriptors, 3);
  EXPECT_FALSE(login.rate_limit.has_value());
  EXPECT_EQ(At(login.descriptors, 0).rate_limit->limit.options.rate, (Rate{2, Duration::Hours(1)}));

  const EnvoyDomain& api = config->envoy->domains[2];
  const EnvoyDescriptor& orders = At(api.descriptors, 0);
  EXPECT_TRUE(At(orders.descriptors, 0).shadow_mode);
  EXPECT_EQ(At(orders.descriptors, 0).rate_limit->name, "trial");
  EXPECT_EQ(At(orders.descriptors, 1).value, "team-*");
  EXPECT_EQ(At(api.descriptors, 2).rate_limit->replaces, std::vector<std::string>{"free_daily"});
}

TEST(EnvoyConfig, SluiceExtensionsInsideRateLimit) {
  absl::StatusOr<Config> config = LoadConfigFile(SLUICE_SOURCE_DIR "/tests/envoy/sluice.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  const EnvoyDomain& ext = config->envoy->domains[3];
  const EnvoyRateLimit& bucket = *At(ext.descriptors, 0).rate_limit;
  EXPECT_EQ(bucket.limit.options.algorithm, Algorithm::kTokenBucket);
  EXPECT_EQ(bucket.limit.options.rate, (Rate{2, Duration::Seconds(1)}));
  EXPECT_EQ(bucket.limit.options.burst, 4);
  EXPECT_EQ(bucket.unit, EnvoyUnit::kSecond);  // reported to Envoy in its own terms
  EXPECT_EQ(bucket.requests_per_unit, 2u);
  const EnvoyRateLimit& window = *At(ext.descriptors, 1).rate_limit;
  EXPECT_EQ(window.limit.options.algorithm, Algorithm::kSlidingWindow);
  EXPECT_EQ(window.limit.options.rate, (Rate{3, Duration::Seconds(10)}));
  EXPECT_EQ(window.unit, EnvoyUnit::kUnknown);  // 10 s is no Envoy unit
  EXPECT_EQ(window.requests_per_unit, 3u);
  const EnvoyRateLimit& gcra = *At(ext.descriptors, 2).rate_limit;
  EXPECT_EQ(gcra.limit.options.algorithm, Algorithm::kGcra);
  EXPECT_EQ(gcra.unit, EnvoyUnit::kMinute);
  EXPECT_EQ(gcra.limit.options.burst, 2);
}

TEST(EnvoyConfig, ScopeDefaultsToGlobalWithASharedStore) {
  const std::string yaml = "domain: d\ndescriptors:\n  - {key: k, rate_limit: {rate: 1/s}}\n";
  EXPECT_EQ(ParseEnvoyDomain(yaml, "rl.yaml")->descriptors[0].rate_limit->limit.scope,
            Scope::kLocal);
  EXPECT_EQ(ParseEnvoyDomain(yaml, "rl.yaml", {.shared_store = true})
                ->descriptors[0]
                .rate_limit->limit.scope,
            Scope::kGlobal);
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 1/s, scope: global}\n"),
      "rl.yaml:4: descriptors[0].rate_limit.scope: global needs a shared store (store.redis), "
      "none is configured");
}

TEST(EnvoyConfigErrors, NameFileLineAndKey) {
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limits: {}\n"),
            "rl.yaml:4: descriptors[0].rate_limits: unknown key (expected one of: key, value, "
            "rate_limit, descriptors, shadow_mode, detailed_metric, metadata, share_threshold)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n"),
            "rl.yaml:5: descriptors[0].rate_limit.requests_per_unit: required with unit (0 denies "
            "every request; write it when that is meant)");
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, "
              "requests_per_unit: 1}\n"),
      "rl.yaml:4: descriptors[0].rate_limit.unit: unknown unit \"fortnight\" (expected one of: "
      "second, minute, hour, day, week, month, year)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: -1}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be from 0 to 4294967295, "
            "got -1");
  EXPECT_EQ(ErrorOf("descriptors: []\n"), "rl.yaml:1: domain: required");
  EXPECT_EQ(ErrorOf("domain: \"\"\n"), "rl.yaml:1: domain: must not be empty");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - value: v\n"),
            "rl.yaml:3: descriptors[0].key: required");
}

TEST(EnvoyConfigErrors, ShareThresholdNeedsAWildcardValue) {
  // As envoyproxy/ratelimit: sharing is of the values a wildcard matches.
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    value: a\n    share_threshold: true\n"),
      "rl.yaml:5: descriptors[0].share_threshold: share_threshold needs a wildcard value (one "
      "with `*`, such as `files*`)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n"),
            "rl.yaml:4: descriptors[0].share_threshold: share_threshold needs a wildcard value "
            "(one with `*`, such as `files*`)");
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    value: a*\n"
              "    share_threshold: yes please\n"),
      "rl.yaml:5: descriptors[0].share_threshold: expected true or false, got \"yes please\"");
  absl::StatusOr<EnvoyDomain> shared = ParseEnvoyDomain(
      "domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n", "rl.yaml");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_TRUE(shared->descriptors[0].share_threshold);
}

TEST(EnvoyConfigErrors, EnvoyShadowModeNeedsRulesToShadow) {
  EXPECT_EQ(ConfigErrorOf("envoy_shadow_mode: true\n"),
            "t.yaml:1: envoy_shadow_mode: shadows the envoy rules: set envoy or envoy_files");
  EXPECT_EQ(ConfigErrorOf("envoy: [{domain: d, descriptors: []}]\nenvoy_shadow_mode: 1\n"),
            "t.yaml:2: envoy_shadow_mode: expected true or false, got \"1\"");
}

TEST(EnvoyConfig, EnvoyLimitHeadersNameTheirHeaders) {
  const std::string rules = "envoy: [{domain: d, descriptors: []}]\n";
  absl::StatusOr<Config> c = ParseConfig(
      rules + "envoy_limit_headers:\n  response: true\n  request: {remaining: X-Quota-Left}\n",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->envoy->response_limit_headers, EnvoyLimitHeaders{});  // the peer's names
  EXPECT_EQ(c->envoy->response_limit_headers->remaining, "RateLimit-Remaining");
  EXPECT_EQ(c->envoy->request_limit_headers, (EnvoyLimitHeaders{.remaining = "X-Quota-Left"}));
  c = ParseConfig(rules + "envoy_limit_headers: {response: false}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->envoy->response_limit_headers.has_value());
  EXPECT_FALSE(c->envoy->request_limit_headers.has_value());
  // The peer's legacy names are sluice's own only with server.legacy_headers.
  c = ParseConfig(rules + "envoy_limit_headers: {response: {limit: X-RateLimit-Limit}}\n",
                  "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->envoy->response_limit_headers->limit, "X-RateLimit-Limit");
}

TEST(EnvoyConfigErrors, EnvoyLimitHeadersAreHeaderNamesOfTheirOwn) {
  const std::string rules = "envoy: [{domain: d, descriptors: []}]\n";
  EXPECT_EQ(ConfigErrorOf("envoy_limit_headers: {response: true}\n"),
            "t.yaml:1: envoy_limit_headers: names headers of the envoy rules: set envoy or "
            "envoy_files");
  EXPECT_EQ(ConfigErrorOf(rules + "envoy_limit_headers: {response: {limit: \"a b\"}}\n"),
            "t.yaml:2: envoy_limit_headers.response.limit: \"a b\" is not a header name of at "
            "most 128 bytes");
  EXPECT_EQ(ConfigErrorOf(rules + "envoy_limit_headers: {request: {reset: ratelimit}}\n"),
            "t.yaml:2: envoy_limit_headers.request.reset: \"ratelimit\": sluice sends this "
            "header itself");
  EXPECT_EQ(ConfigErrorOf("server: {legacy_headers: true}\n" + rules +
                          "envoy_limit_headers: {response: {remaining: X-RateLimit-Remaining}}\n"),
            "t.yaml:3: envoy_limit_headers.response.remaining: \"X-RateLimit-Remaining\": sluice "
            "sends this header itself (server.legacy_headers)");
  EXPECT_EQ(ConfigErrorOf(rules + "envoy_limit_headers: {response: {reset: RateLimit-Limit}}\n"),
            "t.yaml:2: envoy_limit_headers.response.reset: \"RateLimit-Limit\" names two of limit, "
            "remaining and reset");
  EXPECT_EQ(ConfigErrorOf(rules + "envoy_limit_headers: {response: maybe}\n"),
            "t.yaml:2: envoy_limit_headers.response: expected true or false, got \"maybe\"");
  EXPECT_EQ(ConfigErrorOf(rules + "envoy_limit_headers: {respons: true}\n"),
            "t.yaml:2: envoy_limit_headers.respons: unknown key (expected one of: response, "
            "request)");
}

TEST(EnvoyConfigErrors, EnvoyMergeDomainsRefusesADescriptorTwice) {
  const std::string twice =
      "envoy_merge_domains: true\nenvoy:\n  - domain: d\n    descriptors:\n      - key: k\n"
      "  - domain: d\n    descriptors:\n      - key: j\n      - key: k\n";
  EXPECT_EQ(ConfigErrorOf(twice),
            "t.yaml:9: descriptors[1]: duplicate descriptor key \"k\" (any value) in domain \"d\" "
            "(first at t.yaml:5)");
  EXPECT_EQ(ConfigErrorOf("envoy_merge_domains: true\n"),
            "t.yaml:1: envoy_merge_domains: merges envoy domains: set envoy or envoy_files");
  // Without it, a domain twice is refused.
  EXPECT_EQ(ConfigErrorOf(twice.substr(twice.find('\n') + 1)),
            "t.yaml:5: envoy[1].domain: duplicate domain \"d\" (first at t.yaml:2)");
}

TEST(EnvoyConfigErrors, KnownButUnimplementedKeysAreNamed) {
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    value_to_metric: true\n"),
            "rl.yaml:4: descriptors[0].value_to_metric: not supported by sluice: descriptor values "
            "in metric names (sluice's metrics are per rule)");
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 1/s, algorithm: "
              "leaky_bucket, mode: shape}\n"),
      "rl.yaml:4: descriptors[0].rate_limit.mode: not supported by sluice: leaky_bucket mode "
      "shape (Envoy cannot hold a request for its departure time; leaky_bucket here polices)");
  // Envoy never says when a request ends: no slot could be released.
  EXPECT_THAT(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 1/s, "
                      "algorithm: concurrency}\n"),
              ::testing::HasSubstr(
                  "concurrency limits are not offered through Envoy's rate limit service"));
  // quota_mode changes decisions (over the limit is admitted): refused, named.
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: "
                    "{unit: hour, requests_per_unit: 5}\n"),
            "rl.yaml:4: descriptors[0].quota_mode: not supported by sluice: soft limits that admit "
            "requests over the limit and report them in dynamic metadata (sluice denies over the "
            "limit and sends no dynamic metadata; use shadow_mode to count without denying)");
}

TEST(EnvoyConfig, UnitMultiplierMakesOneWindowOfSeveralUnits) {
  absl::StatusOr<EnvoyDomain> d = ParseEnvoyDomain(
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 20, "
      "unit_multiplier: 5}\n",
      "rl.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  const EnvoyRateLimit& rl = *d->descriptors[0].rate_limit;
  EXPECT_EQ(rl.limit.options.rate, (Rate{20, Duration::Minutes(5)}));
  EXPECT_EQ(rl.unit, EnvoyUnit::kMinute);  // reported as configured, as the peer does
  EXPECT_EQ(rl.requests_per_unit, 20u);
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
                    "requests_per_unit: 1, unit_multiplier: 367}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.unit_multiplier: must be from 1 to 366, got 367");
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 1/s, "
              "unit_multiplier: 2}\n"),
      "rl.yaml:4: descriptors[0].rate_limit.unit_multiplier: applies to unit + requests_per_unit");
}

TEST(EnvoyConfig, MetadataIsAcceptedIgnoredAndReported) {
  // metadata only feeds dynamic metadata, which sluice does not send: the
  // rule loads and decides as without it, and the operator is told.
  const std::string yaml =
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
      "    metadata:\n      backend: primary\n      tier: [a, b]\n";
  absl::StatusOr<EnvoyDomain> domain = ParseEnvoyDomain(yaml, "rl.yaml");
  ASSERT_TRUE(domain.ok()) << domain.status();
  EXPECT_EQ(domain->descriptors[0].rate_limit->requests_per_unit, 5u);
  EXPECT_THAT(domain->warnings,
              testing::ElementsAre("rl.yaml:6: descriptors[0].metadata: ignored: sluice sends no "
                                   "dynamic metadata"));
  EXPECT_TRUE(
      ParseEnvoyDomain("domain: d\ndescriptors:\n  - key: k\n", "rl.yaml")->warnings.empty());
}

TEST(EnvoyConfigErrors, ConflictingAndMeaninglessSettings) {
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: "
                    "second, requests_per_unit: 1}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.unit: unit does not apply to an unlimited "
            "rate_limit (unlimited: true)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: 1, rate: 2/s}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.rate: set unit + requests_per_unit, or rate (or "
            "limit + period), not both");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                    "requests_per_unit: 0, algorithm: gcra}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.algorithm: algorithm does not apply with "
            "requests_per_unit: 0 (every request is denied)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 1/s, burst: 5}\n"),
            "rl.yaml:4: descriptors[0].rate_limit: fixed_window: burst applies only to "
            "token_bucket, gcra and leaky_bucket mode police (a window's limit is its rate)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate: 10/fortnight}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.rate: rate \"10/fortnight\": period "
            "\"fortnight\": unknown unit \"fortnight\" (use us, ms, s, m or min, h, d)");
  // As envoyproxy/ratelimit, shadow_mode without a rate_limit loads and does
  // nothing; sluice says so.
  EXPECT_THAT(
      ParseEnvoyDomain("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n", "rl.yaml")
          ->warnings,
      testing::ElementsAre("rl.yaml:4: descriptors[0].shadow_mode: ignored: no rate_limit "
                           "on this descriptor"));
}

TEST(EnvoyConfigErrors, DuplicatesAndDanglingReplaces) {
  EXPECT_EQ(
      ErrorOf("domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n"),
      "rl.yaml:4: descriptors[1]: duplicate descriptor key \"k\" value \"v\" (first at line 3)");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      rate: 1/s\n"
                    "      replaces: [{name: nobody}]\n"),
            "rl.yaml:6: descriptors[0].rate_limit.replaces[0].name: no rate_limit of domain \"d\" "
            "is named \"nobody\"");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      rate: 1/s\n"
                    "      name: me\n      replaces: [{name: me}]\n"),
            "rl.yaml:7: descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself");
}

// A rule's name follows the name rule of every sluice file (at most 128);
// domains, keys and values are descriptor text, matched against what Envoy
// sends (at most 256 bytes). The limit keys read as in the serve config.
TEST(EnvoyConfigErrors, BoundsAndWordsAreTheConfigs) {
  const std::string rule = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: ";
  EXPECT_EQ(ErrorOf(rule + "{rate: 1/s, name: " + std::string(129, 'n') + "}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.name: name is 129 bytes long, the most is 128");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: " + std::string(257, 'k') + "\n"),
            "rl.yaml:3: descriptors[0].key: is 257 bytes long, the most is 256");
  EXPECT_EQ(ErrorOf(rule + "{algorithm: token_bucket, rate: 1/s, burst: 1099511627777}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.burst: must be from 1 to 1099511627776, got "
            "1099511627777");
  EXPECT_EQ(ErrorOf(rule + "{rate: 1/s, limit: 5}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.limit: set rate or limit + period, not both");
  EXPECT_EQ(ErrorOf(rule + "{limit: 5, period: 0s}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.period: must be longer than 0, got 0s");
  EXPECT_EQ(ErrorOf(rule + "{rate: 1/s, algorithm: [gcra]}\n"),
            "rl.yaml:4: descriptors[0].rate_limit.algorithm: expected one of: token_bucket, gcra, "
            "leaky_bucket, fixed_window, sliding_log, sliding_window, concurrency, got a list");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors: k\n"),
            "rl.yaml:2: descriptors: expected a list of descriptors, got \"k\" (write [k])");
  EXPECT_EQ(
      ErrorOf("domain: d\n---\ndomain: e\n"),
      "rl.yaml:3: an envoy rate limit file holds one YAML document; a second one starts here");
}

TEST(EnvoyConfigErrors, AQuoteNeverClosedIsRefused) {
  // Regression: the rule loaded with `'v1\n    rate_limit: ...` as its value
  // and limited nothing.
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: k\n    value: 'v1\n    rate_limit:\n"
                    "      unit: second\n      requests_per_unit: 1\n"),
            "rl.yaml:4:12: a quoted value starts here and its ' is never closed");
  EXPECT_EQ(ErrorOf("domain: d\ndescriptors:\n  - key: \"k\n    value: v1\n"),
            "rl.yaml:3:10: a quoted value starts here and its \" is never closed");
  // Closed quotes, with their escapes, are fine.
  absl::StatusOr<EnvoyDomain> d = ParseEnvoyDomain(
      "domain: d\ndescriptors:\n  - key: 'it''s'\n    value: \"a \\\" b\"\n"
      "    rate_limit: {unit: second, requests_per_unit: 1}\n",
      "rl.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->descriptors[0].key, "it's");
  EXPECT_EQ(*d->descriptors[0].value, "a \" b");
}

TEST(EnvoyConfigErrors, InTheMainConfig) {
  EXPECT_EQ(ConfigErrorOf("envoy:\n  - domain: d\n    descriptors:\n      - key: k\n        "
                          "rate_limit: {unit: minute}\n"),
            "t.yaml:5: envoy[0].descriptors[0].rate_limit.requests_per_unit: required with unit "
            "(0 denies every request; write it when that is meant)");
  EXPECT_EQ(ConfigErrorOf("envoy: {domain: d}\n"),
            "t.yaml:1: envoy: expected a list of domains (- domain: ...), got a map");
  EXPECT_EQ(ConfigErrorOf("envoy:\n  - domain: d\n  - domain: d\n"),
            "t.yaml:3: envoy[1].domain: duplicate domain \"d\" (first at t.yaml:2)");
  EXPECT_EQ(ConfigErrorOf("envoy_files: [does-not-exist.yaml]\n", "/nowhere/t.yaml"),
            "/nowhere/t.yaml:1: envoy_files[0]: /nowhere/does-not-exist.yaml: cannot read: No such "
            "file or directory");
  EXPECT_EQ(ConfigErrorOf("grpc: {listen: 127.0.0.1}\n"),
            "t.yaml:1: grpc.listen: address \"127.0.0.1\": missing port (expected HOST:PORT, "
            "e.g. 127.0.0.1:8080)");
  EXPECT_EQ(ConfigErrorOf("grpc: {port: 1}\n"),
            "t.yaml:1: grpc.port: unknown key (expected one of: listen, max_connections, "
            "handshake_timeout, idle_timeout, max_connection_age, max_connection_age_grace, tls)");
  EXPECT_EQ(ConfigErrorOf("server: {listen: 127.0.0.1:8080}\ngrpc: {listen: 127.0.0.1:8080}\n"),
            "t.yaml:2: grpc.listen: same address as server.listen, server.admin or "
            "server.decision.listen; gRPC needs its own");
}

TEST(EnvoyConfigErrors, AFileNamesItselfAndDuplicatesAcrossFiles) {
  const std::string dir = testing::TempDir();
  std::ofstream(dir + "/envoy_a.yaml") << "domain: shared\n";
  std::ofstream(dir + "/envoy_b.yaml") << "# b\ndomain: shared\ndescriptors:\n  - key: k\n";
  std::ofstream(dir + "/envoy_bad.yaml") << "domain: x\ndescriptors:\n  - key: k\n    rate_limit: "
                                            "{unit: minute, requests_per_unit: 1, "
                                            "burst: 2}\n";
  EXPECT_EQ(ConfigErrorOf("envoy_files: [envoy_a.yaml, envoy_b.yaml]\n", dir + "/t.yaml"),
            dir + "/envoy_b.yaml:2: domain: duplicate domain \"shared\" (first at " + dir +
                "/envoy_a.yaml:1)");
  EXPECT_EQ(
      ConfigErrorOf("envoy_files: [envoy_bad.yaml]\n", dir + "/t.yaml"),
      dir +
          "/envoy_bad.yaml:4: descriptors[0].rate_limit: fixed_window: burst applies only "
          "to token_bucket, gcra and leaky_bucket mode police (a window's limit is its rate)");
  absl::StatusOr<Config> ok =
      ParseConfig("envoy_files: [" + dir + "/envoy_a.yaml]\n", "/elsewhere/t.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();  // an absolute path is taken as it is
  EXPECT_EQ(ok->envoy->domains[0].domain, "shared");
}

}  // namespace
}  // namespace sluice
