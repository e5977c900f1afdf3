#include "sluice/config.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The message of the error the text gives, or a marker that it loaded.
std::string ErrorOf(std::string_view yaml) {
  absl::StatusOr<Config> config = ParseConfig(yaml, "t.yaml");
  if (config.ok()) return "(loaded without error)";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

Config Load(std::string_view yaml) {
  absl::StatusOr<Config> config = ParseConfig(yaml, "t.yaml");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.value_or(Config{});
}

KeyPart Part(KeyPart::Kind kind, std::string header = "") { return KeyPart{kind, header}; }

LimitSpec Limit(Algorithm algorithm, Rate rate, int64_t burst = 0) {
  LimitSpec spec;
  spec.options.algorithm = algorithm;
  spec.options.rate = rate;
  spec.options.burst = burst;
  return spec;
}

LimitSpec Shape(Rate rate, Duration max_delay, int64_t queue) {
  LimitSpec spec = Limit(Algorithm::kLeakyBucket, rate);
  spec.options.mode = LeakyMode::kShape;
  spec.options.max_delay = max_delay;
  spec.options.queue = queue;
  return spec;
}

// ---- every key, read into the structs ----

TEST(ParseConfig, ReadsEveryKey) {
  const Config config = Load(R"(
server:
  listen: 0.0.0.0:8000
  admin: "[::1]:9000"
  threads: 4
  max_connections: 500
  max_header_bytes: 2048
  max_body_bytes: 0
  read_timeout: 5s
  idle_timeout: 90s
  upstream_timeout: 1500ms
  drain_timeout: 1m
  access_log: true
  legacy_headers: true
  cpu_affinity: true
  underscores_in_headers: true
store:
  memory: {max_keys: 5000}
trusted_proxies: [127.0.0.1/32, "::1", 10.0.0.0/8]
routes:
  - name: app
    match: {path_prefix: /app, method: get, host: Example.COM, headers: [X-Foo]}
    upstream: http://127.0.0.1:3000
  - name: exact
    match: {path: /exact}
    upstream: http://backend.internal
policies:
  - name: login
    match: {path_prefix: /login, method: POST}
    key: [client_ip, "header:X-Api-Key", path, route]
    on_missing_key: client_ip
    limits:
      - {algorithm: token_bucket, rate: 40/s, burst: 50, scope: local}
      - {algorithm: sliding_window, limit: 300, period: 1m}
      - {algorithm: leaky_bucket, mode: shape, rate: 10/s, max_delay: 5s, queue: 20}
    shadow: true
    on_deny: {status: 503, retry_after_jitter: 2s}
    on_store_error: local
  - name: everyone
    key: [global]
    limits:
      - {algorithm: gcra, rate: 1000/s}
      - {algorithm: leaky_bucket, mode: police, rate: 5/s, burst: 10}
      - {algorithm: fixed_window, rate: 100/h}
      - {algorithm: sliding_log, rate: 10/5s}
    on_store_error: deny
)");
  EXPECT_EQ(config.source, "t.yaml");
  EXPECT_EQ(config.server, (ServerConfig{
                               .listen = {"0.0.0.0", 8000},
                               .admin = {"::1", 9000},
                               .threads = 4,
                               .max_connections = 500,
                               .max_header_bytes = 2048,
                               .max_body_bytes = 0,
                               .read_timeout = Duration::Seconds(5),
                               .idle_timeout = Duration::Seconds(90),
                               .upstream_timeout = Duration::Millis(1500),
                               .drain_timeout = Duration::Minutes(1),
                               .access_log = true,
                               .legacy_headers = true,
                               .cpu_affinity = true,
                               .underscores_in_headers = true,
                           }));
  EXPECT_EQ(config.store, StoreConfig{.max_keys = 5000});
  EXPECT_THAT(config.trusted_proxies,
              ElementsAre(*ParseCidr("127.0.0.1/32"), *ParseCidr("::1"), *ParseCidr("10.0.0.0/8")));

  ASSERT_EQ(config.routes.size(), 2u);
  EXPECT_EQ(config.routes[0], (RouteConfig{.name = "app",
                                           .match = {.path_prefix = "/app",
                                                     .path = std::nullopt,
                                                     .method = "GET",
                                                     .host = "example.com",
                                                     .headers = {"x-foo"}},
                                           .upstream = {"127.0.0.1", 3000}}));
  EXPECT_EQ(config.routes[1], (RouteConfig{.name = "exact",
                                           .match = {.path_prefix = std::nullopt,
                                                     .path = "/exact",
                                                     .method = std::nullopt,
                                                     .host = std::nullopt,
                                                     .headers = {}},
                                           .upstream = {"backend.internal", 80}}));

  ASSERT_EQ(config.policies.size(), 2u);
  const PolicyConfig& login = config.policies[0];
  EXPECT_EQ(login.name, "login");
  EXPECT_EQ(login.match, (MatchConfig{.path_prefix = "/login",
                                      .path = std::nullopt,
                                      .method = "POST",
                                      .host = std::nullopt,
                                      .headers = {}}));
  EXPECT_THAT(login.key,
              ElementsAre(Part(KeyPart::Kind::kClientIp), Part(KeyPart::Kind::kHeader, "x-api-key"),
                          Part(KeyPart::Kind::kPath), Part(KeyPart::Kind::kRoute)));
  EXPECT_EQ(login.on_missing_key, MissingKey::kClientIp);
  EXPECT_THAT(login.limits,
              ElementsAre(Limit(Algorithm::kTokenBucket, {40, Duration::Seconds(1)}, 50),
                          Limit(Algorithm::kSlidingWindow, {300, Duration::Minutes(1)}),
                          Shape({10, Duration::Seconds(1)}, Duration::Seconds(5), 20)));
  for (const LimitSpec& limit : login.limits) EXPECT_EQ(limit.scope, Scope::kLocal);
  EXPECT_TRUE(login.shadow);
  EXPECT_EQ(login.on_deny, (DenyConfig{.status = 503, .retry_after_jitter = Duration::Seconds(2)}));
  EXPECT_EQ(login.on_store_error, OnStoreError::kLocal);

  const PolicyConfig& everyone = config.policies[1];
  EXPECT_EQ(everyone.match, std::nullopt);
  EXPECT_THAT(everyone.key, ElementsAre(Part(KeyPart::Kind::kGlobal)));
  EXPECT_THAT(everyone.limits,
              ElementsAre(Limit(Algorithm::kGcra, {1000, Duration::Seconds(1)}),
                          Limit(Algorithm::kLeakyBucket, {5, Duration::Seconds(1)}, 10),
                          Limit(Algorithm::kFixedWindow, {100, Duration::Hours(1)}),
                          Limit(Algorithm::kSlidingLog, {10, Duration::Seconds(5)})));
  EXPECT_EQ(everyone.on_store_error, OnStoreError::kDeny);
}

// ---- defaults ----

TEST(ParseConfig, EmptyTextIsAServerThatLimitsNothing) {
  const Config config = Load("");
  EXPECT_EQ(config.source, "t.yaml");
  EXPECT_EQ(config.server, ServerConfig{});
  EXPECT_EQ(config.store, StoreConfig{});
  EXPECT_TRUE(config.trusted_proxies.empty());
  EXPECT_TRUE(config.routes.empty());
  EXPECT_TRUE(config.policies.empty());
}

TEST(ParseConfig, CommentsOnlyAndEmptyListsAreValid) {
  EXPECT_TRUE(Load("# nothing yet\n").policies.empty());
  EXPECT_TRUE(Load("policies: []\nroutes: []\ntrusted_proxies: []\n").policies.empty());
  EXPECT_TRUE(Load("policies:\n").policies.empty());
}

TEST(ParseConfig, ServerDefaultsMatchTheHeader) {
  const ServerConfig server = Load("server: {}\nstore:\n").server;
  EXPECT_EQ(server.listen, (HostPort{"127.0.0.1", 8080}));
  EXPECT_EQ(server.admin, (HostPort{"127.0.0.1", 9090}));
  EXPECT_EQ(server.threads, 0);
  EXPECT_EQ(server.max_connections, 10'000);
  EXPECT_EQ(server.max_header_bytes, 16384);
  EXPECT_EQ(server.max_body_bytes, 1048576);
  EXPECT_EQ(server.read_timeout, Duration::Seconds(10));
  EXPECT_EQ(server.idle_timeout, Duration::Seconds(60));
  EXPECT_EQ(server.upstream_timeout, Duration::Seconds(30));
  EXPECT_EQ(server.drain_timeout, Duration::Seconds(10));
  EXPECT_FALSE(server.access_log);
  EXPECT_FALSE(server.legacy_headers);
  EXPECT_FALSE(server.cpu_affinity);
  EXPECT_EQ(Load("store: {memory: {}}").store.max_keys, 1'000'000);
  EXPECT_EQ(Load("store: {memory: {}}").store.on_full, OnFull::kRemember);
  EXPECT_EQ(Load("store: {memory: {on_full: deny_new}}").store.on_full, OnFull::kDenyNew);
  EXPECT_EQ(Load("store: {memory: {on_full: evict}}").store.on_full, OnFull::kEvict);
}

TEST(ParseConfig, GrpcDefaultsMatchTheHeader) {
  const Config config = Load("grpc: {}\n");
  ASSERT_TRUE(config.grpc.has_value());
  EXPECT_EQ(config.grpc->listen, (HostPort{"127.0.0.1", 8081}));
  EXPECT_EQ(config.grpc->max_connections, 1'000);
  EXPECT_EQ(config.grpc->handshake_timeout, Duration::Seconds(10));
  EXPECT_EQ(config.grpc->idle_timeout, Duration::Minutes(5));
  EXPECT_EQ(config.grpc->max_connection_age, Duration::Hours(1));
  EXPECT_EQ(config.grpc->max_connection_age_grace, Duration::Seconds(10));
  EXPECT_FALSE(Load("server: {}\n").grpc.has_value());
}

TEST(ParseConfig, TheQuotaService) {
  const Config config = Load(
      "grpc: {listen: 127.0.0.1:0}\n"
      "rlqs:\n"
      "  assignment_ttl: 5s\n"
      "  abandon_after: 2m\n"
      "  max_buckets_per_stream: 50\n"
      "  domains:\n"
      "    - domain: web\n"
      "      buckets:\n"
      "        - {match: {name: api, client: '*'}, rate: 500/s, burst: 100}\n"
      "        - {match: {name: batch}, limit: 10, period: 1m, strategy: requests_per_time_unit}\n"
      "      unknown: {rate: 1/s}\n"
      "    - domain: mail\n"
      "      unknown: allow_all\n");
  ASSERT_TRUE(config.rlqs.has_value());
  const RlqsConfig& q = *config.rlqs;
  EXPECT_EQ(q.assignment_ttl, Duration::Seconds(5));
  EXPECT_EQ(q.abandon_after, Duration::Minutes(2));
  EXPECT_EQ(q.max_buckets_per_stream, 50);
  ASSERT_EQ(q.domains.size(), 2u);
  ASSERT_EQ(q.domains[0].buckets.size(), 2u);
  // Sorted by key.
  EXPECT_EQ(q.domains[0].buckets[0].match,
            (std::vector<std::pair<std::string, std::string>>{{"client", "*"}, {"name", "api"}}));
  EXPECT_EQ(q.domains[0].buckets[0].limit.rate, (Rate{500, Duration::Seconds(1)}));
  EXPECT_EQ(q.domains[0].buckets[0].limit.burst, 100);
  EXPECT_FALSE(q.domains[0].buckets[0].limit.requests_per_time_unit);
  EXPECT_TRUE(q.domains[0].buckets[1].limit.requests_per_time_unit);
  EXPECT_EQ(q.domains[0].unknown, RlqsUnknown::kLimit);
  EXPECT_EQ(q.domains[0].unknown_limit.rate, (Rate{1, Duration::Seconds(1)}));
  EXPECT_EQ(q.domains[1].unknown, RlqsUnknown::kAllowAll);
  // Defaults.
  const Config d = Load("grpc: {}\nrlqs: {domains: [{domain: web}]}\n");
  EXPECT_EQ(d.rlqs->assignment_ttl, Duration::Seconds(10));
  EXPECT_EQ(d.rlqs->abandon_after, Duration::Seconds(60));
  EXPECT_EQ(d.rlqs->max_buckets_per_stream, 1000);
  EXPECT_EQ(d.rlqs->domains[0].unknown, RlqsUnknown::kDenyAll);
}

TEST(ParseConfig, ConcurrencyLimits) {
  const Config config = Load(
      "policies:\n  - name: p\n    limits:\n"
      "      - {algorithm: concurrency, limit: 10}\n"
      "      - {algorithm: concurrency, limit: 2, lease_ttl: 90s}\n");
  const std::vector<LimitSpec>& limits = config.policies[0].limits;
  ASSERT_EQ(limits.size(), 2u);
  EXPECT_EQ(limits[0].options.algorithm, Algorithm::kConcurrency);
  EXPECT_EQ(limits[0].options.rate.limit, 10);
  EXPECT_EQ(limits[0].options.lease_ttl, Duration::Zero());  // the default, kDefaultLeaseTtl
  EXPECT_EQ(limits[1].options.lease_ttl, Duration::Seconds(90));
}

TEST(ParseConfig, SettledCosts) {
  const Config config = Load(
      "policies:\n  - name: p\n    cost: {estimate: 500, settle: \"response_header:X-Tokens\"}\n"
      "    limits: [{algorithm: gcra, rate: 10000/min}, {algorithm: concurrency, limit: 2}]\n"
      "  - name: q\n    cost: 7\n    limits: [{algorithm: sliding_log, rate: 5/s}]\n");
  EXPECT_EQ(config.policies[0].cost.estimate, 500);
  EXPECT_EQ(config.policies[0].cost.response_header, "X-Tokens");
  EXPECT_EQ(config.policies[1].cost, (CostConfig{.estimate = 7}));
  const std::string head = "policies:\n  - name: p\n    cost: {estimate: 5, settle: ";
  EXPECT_THAT(ErrorOf(head + "\"response_header:X\"}\n    limits: [{algorithm: sliding_log, "
                             "rate: 5/s}]\n"),
              HasSubstr("limits[0] (sliding_log) cannot carry debt"));
  EXPECT_THAT(ErrorOf(head + "\"body:tokens\"}\n    limits: [{algorithm: gcra, rate: 5/s}]\n"),
              HasSubstr("expected response_header:NAME"));
  EXPECT_THAT(ErrorOf(head + "\"response_header:X Y\"}\n    limits: [{algorithm: gcra, "
                             "rate: 5/s}]\n"),
              HasSubstr("expected response_header:NAME"));
  EXPECT_THAT(ErrorOf("policies:\n  - name: p\n    cost: {settle: \"response_header:X\"}\n"
                      "    limits: [{algorithm: gcra, rate: 5/s}]\n"),
              HasSubstr("estimate: required"));
}

TEST(ConfigErrors, ConcurrencyLimits) {
  const std::string head = "policies:\n  - name: p\n    limits:\n      - ";
  EXPECT_THAT(ErrorOf(head + "{algorithm: concurrency}\n"),
              HasSubstr("limit: required (the requests in flight)"));
  EXPECT_THAT(ErrorOf(head + "{algorithm: concurrency, rate: 10/s}\n"),
              HasSubstr("rate does not apply to concurrency"));
  EXPECT_THAT(ErrorOf(head + "{algorithm: concurrency, limit: 10, period: 1s}\n"),
              HasSubstr("period does not apply to concurrency"));
  EXPECT_THAT(ErrorOf(head + "{algorithm: concurrency, limit: 0}\n"), HasSubstr("limit"));
  EXPECT_THAT(ErrorOf(head + "{algorithm: concurrency, limit: 5, lease_ttl: 10ms}\n"),
              HasSubstr("lease_ttl"));
  EXPECT_THAT(ErrorOf(head + "{algorithm: gcra, rate: 5/s, lease_ttl: 10s}\n"),
              HasSubstr("lease_ttl applies only to concurrency, not gcra"));
  // The gateway holds a slot until the upstream answers or times out.
  EXPECT_THAT(ErrorOf("server: {upstream_timeout: 30s}\nroutes:\n  - {name: r, match: "
                      "{path_prefix: /}, upstream: \"http://127.0.0.1:1\"}\n" +
                      head + "{algorithm: concurrency, limit: 5, lease_ttl: 30s}\n"),
              HasSubstr("lease_ttl 30s must be longer than server.upstream_timeout (30s)"));
}

TEST(ConfigErrors, TheQuotaService) {
  EXPECT_EQ(ErrorOf("rlqs: {domains: [{domain: web}]}\n"),
            "t.yaml:1: rlqs: the quota service is served on grpc.listen: set grpc");
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {}\n"), HasSubstr("domains"));
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {domains: [{domain: web}, {domain: web}]}\n"),
              HasSubstr("domain \"web\" twice"));
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {domains: [{domain: web, buckets: [{rate: 1/s}]}]}\n"),
              HasSubstr("match"));
  EXPECT_THAT(
      ErrorOf("grpc: {}\nrlqs: {domains: [{domain: web, buckets: [{match: {}, rate: 1/s}]}]}\n"),
      HasSubstr("expected a map of bucket_id keys and values"));
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {domains: [{domain: web, buckets: [{match: {a: b}, "
                      "rate: 1/s, strategy: leaky}]}]}\n"),
              HasSubstr("strategy"));
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {domains: [{domain: web, unknown: maybe}]}\n"),
              HasSubstr("unknown"));
  EXPECT_THAT(ErrorOf("grpc: {}\nrlqs: {assignment_ttl: 1ms, domains: [{domain: web}]}\n"),
              HasSubstr("assignment_ttl"));
}

TEST(ParseConfig, GrpcConnectionLimits) {
  const Config config = Load(
      "grpc:\n"
      "  listen: 127.0.0.1:0\n"
      "  max_connections: 64\n"
      "  handshake_timeout: 1500ms\n"
      "  idle_timeout: 2s\n"
      "  max_connection_age: 30m\n"
      "  max_connection_age_grace: 5s\n");
  ASSERT_TRUE(config.grpc.has_value());
  EXPECT_EQ(config.grpc->listen, (HostPort{"127.0.0.1", 0}));
  EXPECT_EQ(config.grpc->max_connections, 64);
  EXPECT_EQ(config.grpc->handshake_timeout, Duration::Millis(1500));
  EXPECT_EQ(config.grpc->idle_timeout, Duration::Seconds(2));
  EXPECT_EQ(config.grpc->max_connection_age, Duration::Minutes(30));
  EXPECT_EQ(config.grpc->max_connection_age_grace, Duration::Seconds(5));
}

TEST(ParseConfig, PolicyDefaults) {
  const Config config =
      Load("policies:\n  - name: p\n    limits: [{algorithm: gcra, rate: 5/s}]\n");
  ASSERT_EQ(config.policies.size(), 1u);
  const PolicyConfig& p = config.policies[0];
  EXPECT_EQ(p.match, std::nullopt);
  EXPECT_THAT(p.key, ElementsAre(Part(KeyPart::Kind::kClientIp)));
  EXPECT_EQ(p.on_missing_key, MissingKey::kDeny);
  EXPECT_FALSE(p.shadow);
  EXPECT_EQ(p.on_deny, (DenyConfig{.status = 429, .retry_after_jitter = std::nullopt}));
  EXPECT_EQ(p.on_store_error, OnStoreError::kAllow);
  ASSERT_EQ(p.limits.size(), 1u);
  EXPECT_EQ(p.limits[0].scope, Scope::kLocal);
  EXPECT_EQ(p.limits[0].options.burst, 0);  // MakeLimit's default: one period's worth
}

TEST(ParseConfig, AMatchHostIsKeptAsRequestsAreRead) {
  // Lower case, and a fully qualified name without its dot, as
  // policy::HostName reads a request's.
  const Config config = Load(
      "policies:\n  - name: p\n    match: {host: API.Example.com.}\n"
      "    limits: [{algorithm: gcra, rate: 5/s}]\n");
  EXPECT_EQ(config.policies[0].match->host, "api.example.com");
}

TEST(ParseConfig, EmptyMatchMapMatchesEverything) {
  const Config config =
      Load("policies:\n  - name: p\n    match: {}\n    limits: [{algorithm: gcra, rate: 5/s}]\n");
  EXPECT_EQ(config.policies[0].match, MatchConfig{});
}

TEST(ParseConfig, UpstreamPortDefaultsTo80AndATrailingSlashIsAllowed) {
  const Config config = Load(
      "routes:\n"
      "  - {name: a, upstream: http://example.com}\n"
      "  - {name: b, upstream: \"http://[::1]/\"}\n"
      "  - {name: c, upstream: HTTP://10.0.0.1:81/}\n");
  EXPECT_EQ(config.routes[0].upstream, (HostPort{"example.com", 80}));
  EXPECT_EQ(config.routes[1].upstream, (HostPort{"::1", 80}));
  EXPECT_EQ(config.routes[2].upstream, (HostPort{"10.0.0.1", 81}));
}

TEST(ParseConfig, UnquotedHeaderKeyPartInAFlowList) {
  const Config config = Load(
      "policies:\n  - name: p\n    key: [header:X-Api-Key]\n    limits: [{algorithm: gcra, rate: "
      "5/s}]\n");
  EXPECT_THAT(config.policies[0].key, ElementsAre(Part(KeyPart::Kind::kHeader, "x-api-key")));
}

// ---- the error format: file, line, path ----

TEST(ConfigErrors, YamlSyntaxErrorGivesLineAndColumn) {
  EXPECT_EQ(ErrorOf("server:\n  threads: [1, 2\npolicies: []\n"),
            "t.yaml:3:9: end of sequence flow not found");
  EXPECT_EQ(ErrorOf("policies:\n  - name: a\n name: b\n"), "t.yaml:3:2: end of map not found");
  EXPECT_EQ(ErrorOf("server:\n  listen: \"127.0.0.1:1"), "t.yaml:2:23: illegal EOF in scalar");
  EXPECT_EQ(ErrorOf("policies:\n  - name: a\n    limits: [{algorithm: gcra]\n"),
            "t.yaml:3:30: illegal flow end");
}

TEST(ConfigErrors, UnknownKeysListTheExpectedOnes) {
  EXPECT_EQ(ErrorOf("policies:\n  - name: p\n    limts: []\n"),
            "t.yaml:3: policies[0].limts: unknown key (expected one of: name, match, key, "
            "on_missing_key, client_ip_prefix, limits, shadow, on_deny, on_store_error, long_keys, "
            "cost)");
  EXPECT_EQ(ErrorOf("servr:\n  threads: 2\n"),
            "t.yaml:1: servr: unknown key (expected one of: server, store, trusted_proxies, "
            "real_ip_header, client_ip_prefix, routes, policies, grpc, envoy, envoy_files, "
            "envoy_shadow_mode, envoy_merge_domains, envoy_limit_headers, rlqs)");
  EXPECT_EQ(ErrorOf("server:\n  thread: 2\n"),
            "t.yaml:2: server.thread: unknown key (expected one of: listen, admin, threads, "
            "max_connections, max_header_bytes, max_body_bytes, read_timeout, idle_timeout, "
            "upstream_timeout, drain_timeout, access_log, legacy_headers, cpu_affinity, "
            "underscores_in_headers, decision, tls)");
  EXPECT_EQ(
      ErrorOf(
          "policies:\n  - name: p\n    limits:\n      - {algorithm: gcra, rate: 1/s, brust: 2}\n"),
      "t.yaml:4: policies[0].limits[0].brust: unknown key (expected one of: algorithm, rate, "
      "limit, period, burst, mode, max_delay, queue, scope, lease, lease_ttl)");
  EXPECT_EQ(ErrorOf("routes:\n  - name: r\n    upstream: http://a:1\n    match: {prefix: /}\n"),
            "t.yaml:4: routes[0].match.prefix: unknown key (expected one of: path_prefix, path, "
            "method, host, headers)");
}

TEST(ConfigErrors, DuplicateKeyInOneMap) {
  EXPECT_EQ(ErrorOf("server:\n  threads: 2\n  threads: 3\n"),
            "t.yaml:3: server.threads: duplicate key (first at line 2)");
  EXPECT_EQ(ErrorOf("trusted_proxies:\n  - 10.0.0.0/8\nserver: {}\ntrusted_proxies: []\n"),
            "t.yaml:4: trusted_proxies: duplicate key (first at line 1)");
}

TEST(ConfigErrors, RedisStore) {
  EXPECT_EQ(ErrorOf("store:\n  redis: {url: \"http://127.0.0.1:6379\"}\n"),
            "t.yaml:2: store.redis.url: redis url \"http://127.0.0.1:6379\": must start with "
            "redis://, rediss:// (TLS) or unix:// (a Unix socket)");
  EXPECT_EQ(ErrorOf("store:\n  redis: {timeout: 10ms}\n"),
            "t.yaml:2: store.redis: give exactly one of url (one server), cluster (a list of "
            "nodes) and sentinel (the sentinels of a master)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    cluster: [\"a:1\", \"b\"]\n    database: 2\n"),
            "t.yaml:4: store.redis.database: a Redis Cluster has only database 0");
  EXPECT_EQ(ErrorOf("store:\n  redis: {cluster: [\"redis://a:1\"]}\n"),
            "t.yaml:2: store.redis.cluster[0]: \"redis://a:1\": expected host:port");
  EXPECT_EQ(ErrorOf("store:\n  redis: {url: \"redis://a\", key_prefix: \"x{\"}\n"),
            "t.yaml:2: store.redis.key_prefix: no '{' or '}': they would move the keys' hash tag");
  EXPECT_EQ(ErrorOf("store:\n  redis: {url: \"redis://a\", password_env: SLUICE_NO_SUCH_VAR}\n"),
            "t.yaml:2: store.redis.password_env: the environment has no SLUICE_NO_SUCH_VAR");
}

TEST(ConfigRedis, TlsByTheUrlOrTheTlsKey) {
  Config c = Load("store:\n  redis: {url: \"rediss://app:pw@redis.example.com:6380\"}\n");
  ASSERT_TRUE(c.store.redis.has_value());
  EXPECT_EQ(c.store.redis->tls, (RedisTls{.enabled = true}));
  c = Load("store:\n  redis: {cluster: [\"10.0.0.1:6380\"], tls: true}\n");
  EXPECT_EQ(c.store.redis->tls, (RedisTls{.enabled = true}));
  c = Load("store:\n  redis: {url: \"redis://127.0.0.1\"}\n");
  EXPECT_EQ(c.store.redis->tls, RedisTls{});

  // The files, relative to the config file's folder, readable at load.
  const std::string dir = testing::TempDir() + "/sluice_tls_config";
  std::filesystem::create_directories(dir);
  for (const char* name : {"ca.pem", "client.pem", "client.key"}) {
    std::ofstream(dir + "/" + name) << "-----BEGIN CERTIFICATE-----\n";
  }
  const absl::StatusOr<Config> loaded = ParseConfig(
      "store:\n  redis:\n    cluster: [\"10.0.0.1:6380\"]\n    tls: {ca_file: ca.pem, "
      "cert_file: client.pem, key_file: " +
          dir + "/client.key, server_name: redis.example.com}\n",
      dir + "/sluice.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->store.redis->tls, (RedisTls{.enabled = true,
                                                .ca_file = dir + "/ca.pem",
                                                .cert_file = dir + "/client.pem",
                                                .key_file = dir + "/client.key",
                                                .server_name = "redis.example.com"}));
  std::filesystem::remove_all(dir);
}

TEST(ConfigRedis, TheSentinelsOfAMaster) {
  setenv("SLUICE_TEST_SENTINEL_PASSWORD", "s3cret", 1);
  const Config c = Load(
      "store:\n  redis:\n    sentinel:\n      master: mymaster\n      nodes: [\"10.0.0.1:26379\", "
      "\"[::1]:26380\"]\n      user: watcher\n      password_env: "
      "SLUICE_TEST_SENTINEL_PASSWORD\n    password: master-password\n    database: 2\n");
  unsetenv("SLUICE_TEST_SENTINEL_PASSWORD");
  ASSERT_TRUE(c.store.redis.has_value());
  EXPECT_EQ(c.store.redis->sentinel, (RedisSentinel{.master = "mymaster",
                                                    .nodes = {"10.0.0.1:26379", "[::1]:26380"},
                                                    .user = "watcher",
                                                    .password = "s3cret"}));
  EXPECT_EQ(c.store.redis->password, "master-password");
  EXPECT_EQ(c.store.redis->database, 2);
  EXPECT_TRUE(c.store.redis->url.empty());
  EXPECT_TRUE(c.store.redis->cluster.empty());
}

TEST(ConfigErrors, RedisSentinel) {
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    url: \"redis://a\"\n    sentinel: {master: m, nodes: "
                    "[\"a:26379\"]}\n"),
            "t.yaml:3: store.redis: give exactly one of url (one server), cluster (a list of "
            "nodes) and sentinel (the sentinels of a master)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    sentinel: {nodes: [\"a:26379\"]}\n"),
            "t.yaml:3: store.redis.sentinel: give master (the name the sentinels monitor) and "
            "nodes (sentinels, host:port)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    sentinel: {master: m, nodes: []}\n"),
            "t.yaml:3: store.redis.sentinel.nodes: at least one node (host:port)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    sentinel: {master: m, nodes: [\"redis://a\"]}\n"),
            "t.yaml:3: store.redis.sentinel.nodes[0]: \"redis://a\": expected host:port");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    sentinel: {master: \"my master\", nodes: [\"a:1\"]}\n"),
            "t.yaml:3: store.redis.sentinel.master: expected the name the sentinels monitor the "
            "master by");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    sentinel: {master: m, nodes: [\"a:1\"], password: x, "
                    "password_env: Y}\n"),
            "t.yaml:3: store.redis.sentinel.password_env: give password or password_env, not both");
}

TEST(ConfigErrors, RedisTls) {
  EXPECT_EQ(ErrorOf("store:\n  redis: {url: \"redis://a\", tls: true}\n"),
            "t.yaml:2: store.redis.tls: the url is plain (redis:// or unix://): write rediss:// "
            "for TLS");
  EXPECT_EQ(ErrorOf("store:\n  redis: {url: \"rediss://a\", tls: false}\n"),
            "t.yaml:2: store.redis.tls: TLS cannot be turned off here: remove the key (or use "
            "redis://)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    url: \"rediss://a\"\n    tls: {ca_file: "
                    "/nonexistent/ca.pem}\n"),
            "t.yaml:4: store.redis.tls.ca_file: /nonexistent/ca.pem: cannot read: No such file "
            "or directory");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    url: \"rediss://a\"\n    tls: {cert_file: "
                    "/dev/null}\n"),
            "t.yaml:4: store.redis.tls: give cert_file and key_file together (the client's "
            "certificate and its key)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    url: \"rediss://a\"\n    tls: {verify: false}\n"),
            "t.yaml:4: store.redis.tls.verify: unknown key (expected one of: ca_file, cert_file, "
            "key_file, server_name)");
  EXPECT_EQ(ErrorOf("store:\n  redis:\n    url: \"rediss://a\"\n    tls: {server_name: \"\"}\n"),
            "t.yaml:4: store.redis.tls.server_name: expected a host name");
}

TEST(ConfigServer, TlsOnTheGatewayDecisionAndGrpcListeners) {
  EXPECT_EQ(Load("").server.tls, std::nullopt);
  const std::string dir = testing::TempDir() + "/sluice_server_tls_config";
  std::filesystem::create_directories(dir);
  for (const char* name : {"server.pem", "server.key", "clients.pem"}) {
    std::ofstream(dir + "/" + name) << "-----BEGIN CERTIFICATE-----\n";
  }
  const absl::StatusOr<Config> loaded = ParseConfig(
      "server:\n  tls: {cert_file: server.pem, key_file: server.key, certificates: [{cert_file: "
      "clients.pem, key_file: server.key}]}\n  decision:\n    listen: "
      "127.0.0.1:8082\n    tls: {cert_file: server.pem, key_file: server.key, client_ca_file: " +
          dir + "/clients.pem}\ngrpc:\n  listen: 127.0.0.1:8081\n  tls: {cert_file: server.pem, " +
          "key_file: server.key, client_ca_file: clients.pem, client_name: envoy.internal}\n",
      dir + "/sluice.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->server.tls,
            (ListenerTls{.cert_file = dir + "/server.pem",
                         .key_file = dir + "/server.key",
                         .certificates = {{dir + "/clients.pem", dir + "/server.key"}}}));
  EXPECT_EQ(loaded->server.decision.tls, (ListenerTls{.cert_file = dir + "/server.pem",
                                                      .key_file = dir + "/server.key",
                                                      .client_ca_file = dir + "/clients.pem"}));
  EXPECT_EQ(loaded->grpc->tls, (ListenerTls{.cert_file = dir + "/server.pem",
                                            .key_file = dir + "/server.key",
                                            .client_ca_file = dir + "/clients.pem",
                                            .client_name = "envoy.internal"}));
  std::filesystem::remove_all(dir);
}

TEST(ConfigErrors, ServerTls) {
  EXPECT_EQ(ErrorOf("server:\n  tls: {cert_file: /dev/null}\n"),
            "t.yaml:2: server.tls: give cert_file and key_file (the listener's certificate and "
            "its key)");
  EXPECT_EQ(ErrorOf("server:\n  tls: {cert_file: /dev/null, key_file: /nonexistent/k.pem}\n"),
            "t.yaml:2: server.tls.key_file: /nonexistent/k.pem: cannot read: No such file or "
            "directory");
  EXPECT_EQ(ErrorOf("server:\n  tls: true\n"),
            "t.yaml:2: server.tls: expected a map of keys, got \"true\"");
  EXPECT_EQ(ErrorOf("server:\n  tls: {cert_file: /dev/null, key_file: /dev/null, verify: "
                    "false}\n"),
            "t.yaml:2: server.tls.verify: unknown key (expected one of: cert_file, key_file, "
            "client_ca_file, client_name, certificates)");
  EXPECT_EQ(ErrorOf("server:\n  decision:\n    tls: {cert_file: /dev/null, key_file: "
                    "/dev/null}\n"),
            "t.yaml:3: server.decision.tls: TLS here is for decision.listen, which is not set "
            "(server.tls covers server.listen)");
  EXPECT_EQ(ErrorOf("server:\n  tls: {cert_file: /dev/null, key_file: /dev/null, client_name: "
                    "envoy.internal}\n"),
            "t.yaml:2: server.tls.client_name: a client certificate's name is checked with "
            "client_ca_file: set it");
  EXPECT_EQ(ErrorOf("server:\n  tls: {cert_file: /dev/null, key_file: /dev/null, certificates: "
                    "[{cert_file: /dev/null}]}\n"),
            "t.yaml:2: server.tls.certificates[0]: give cert_file and key_file (a certificate and "
            "its key)");
  EXPECT_EQ(ErrorOf("grpc:\n  tls: {key_file: /dev/null}\n"),
            "t.yaml:2: grpc.tls: give cert_file and key_file (the listener's certificate and its "
            "key)");
}

TEST(ConfigRedis, AGlobalFixedWindowMayBeLeased) {
  const std::string head =
      "store:\n"
      "  redis: {url: \"redis://127.0.0.1\"}\n"
      "policies:\n"
      "  - name: p\n"
      "    limits:\n";
  Config c = Load(head +
                  "      - {algorithm: fixed_window, rate: 50000/h, lease: {size: auto, ttl: 3s}}\n"
                  "      - {algorithm: gcra, rate: 10/s, scope: local}\n");
  ASSERT_EQ(c.policies.size(), 1u);
  ASSERT_TRUE(c.policies[0].limits[0].lease.has_value());
  EXPECT_EQ(c.policies[0].limits[0].lease->size, 0);  // auto
  EXPECT_EQ(c.policies[0].limits[0].lease->ttl, Duration::Seconds(3));
  EXPECT_FALSE(c.policies[0].limits[1].lease.has_value());
  c = Load(head + "      - {algorithm: fixed_window, rate: 100/s, lease: {size: 10}}\n");
  EXPECT_EQ(c.policies[0].limits[0].lease->size, 10);
  EXPECT_EQ(c.policies[0].limits[0].lease->ttl, Duration::Seconds(2));  // the default
  c = Load(head + "      - {algorithm: gcra, rate: 100/s, burst: 20, lease: {size: 2}}\n");
  EXPECT_EQ(c.policies[0].limits[0].lease->size, 2);
  c = Load(head + "      - {algorithm: token_bucket, rate: 100/s, lease: {}}\n");
  EXPECT_TRUE(c.policies[0].limits[0].lease.has_value());
  EXPECT_THAT(ErrorOf(head + "      - {algorithm: sliding_window, rate: 100/s, lease: {}}\n"),
              HasSubstr("policies[0].limits[0].lease: sliding_window cannot be leased"));
  // A burst of 1 has no tolerance to spend a slot in; 2 at 100/s has 10 ms.
  EXPECT_THAT(ErrorOf(head + "      - {algorithm: gcra, rate: 100/s, burst: 1, lease: {}}\n"),
              HasSubstr("gcra with burst 1 at 100/s cannot be leased"));
  EXPECT_THAT(ErrorOf(head + "      - {algorithm: gcra, rate: 1000/s, burst: 10, lease: {}}\n"),
              HasSubstr("needs a burst of 2 or more spanning at least 10ms"));
  c = Load(head + "      - {algorithm: gcra, rate: 100/s, burst: 2, lease: {}}\n");
  EXPECT_TRUE(c.policies[0].limits[0].lease.has_value());
  EXPECT_EQ(
      ErrorOf(head + "      - {algorithm: fixed_window, rate: 100/s, scope: local, lease: {}}\n"),
      "t.yaml:6: policies[0].limits[0].lease: a lease is a slice of a global limit "
      "(scope: global, store.redis)");
  EXPECT_THAT(ErrorOf(head + "      - {algorithm: fixed_window, rate: 100/s, lease: {size: 0}}\n"),
              HasSubstr("lease.size"));
  EXPECT_THAT(ErrorOf(head + "      - {algorithm: fixed_window, rate: 100/s, lease: {sise: 1}}\n"),
              HasSubstr("unknown key"));
}

TEST(ConfigRedis, GlobalIsTheDefaultScopeWithASharedStore) {
  absl::StatusOr<Config> c = ParseConfig(
      "store:\n"
      "  redis: {url: \"redis://app:pw@10.0.0.5:6380/2\", timeout: 20ms}\n"
      "policies:\n"
      "  - name: p\n"
      "    limits:\n"
      "      - {algorithm: gcra, rate: 10/s}\n"
      "      - {algorithm: gcra, rate: 100/s, scope: local}\n",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->store.redis.has_value());
  EXPECT_EQ(c->store.redis->url, "redis://app:pw@10.0.0.5:6380/2");
  EXPECT_EQ(c->store.redis->timeout, Duration::Millis(20));
  EXPECT_TRUE(c->store.redis->cache_denials);  // the default
  EXPECT_EQ(c->policies[0].limits[0].scope, Scope::kGlobal);
  EXPECT_EQ(c->policies[0].limits[1].scope, Scope::kLocal);
  c = ParseConfig("store:\n  redis: {cluster: [\"127.0.0.1:7000\", \"[::1]:7001\"]}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->cluster.size(), 2u);
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", cache_denials: false}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->store.redis->cache_denials);
  EXPECT_EQ(c->store.redis->max_batch, 64);  // the default
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", max_batch: 1}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->max_batch, 1);
  EXPECT_FALSE(ParseConfig("store:\n  redis: {url: \"redis://a\", max_batch: 0}\n", "t.yaml").ok());
  EXPECT_EQ(c->store.redis->calls_in_flight, 2);  // the default
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", calls_in_flight: 1}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->calls_in_flight, 1);
  EXPECT_FALSE(
      ParseConfig("store:\n  redis: {url: \"redis://a\", calls_in_flight: 0}\n", "t.yaml").ok());
  EXPECT_FALSE(
      ParseConfig("store:\n  redis: {url: \"redis://a\", calls_in_flight: 17}\n", "t.yaml").ok());
  EXPECT_FALSE(
      ParseConfig("store:\n  redis: {url: \"redis://a\", max_batch: 1025}\n", "t.yaml").ok());
  EXPECT_EQ(c->store.redis->window_state, WindowState::kInteger);  // the default
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", window_state: integer}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->window_state, WindowState::kInteger);
  EXPECT_FALSE(
      ParseConfig("store:\n  redis: {url: \"redis://a\", window_state: binary}\n", "t.yaml").ok());
  EXPECT_EQ(c->store.redis->linger, Duration::Micros(100));  // the default
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", linger: 0s}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->linger, Duration::Zero());
  c = ParseConfig("store:\n  redis: {url: \"redis://a\", linger: 250us}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store.redis->linger, Duration::Micros(250));
  EXPECT_FALSE(ParseConfig("store:\n  redis: {url: \"redis://a\", linger: 11ms}\n", "t.yaml").ok());
}

TEST(ConfigErrors, WrongShapes) {
  EXPECT_EQ(ErrorOf("- server\n"),
            "t.yaml:1: expected a map of top-level keys (server, store, trusted_proxies, routes, "
            "policies), got a list");
  EXPECT_EQ(ErrorOf("server:\n  - listen: 127.0.0.1:80\n"),
            "t.yaml:2: server: expected a map of keys, got a list");
  EXPECT_EQ(ErrorOf("policies: {name: p}\n"),
            "t.yaml:1: policies: expected a list of policies, got a map");
  EXPECT_EQ(ErrorOf("trusted_proxies: 10.0.0.0/8\n"),
            "t.yaml:1: trusted_proxies: expected a list of addresses or networks, got "
            "\"10.0.0.0/8\" (write [10.0.0.0/8])");
  EXPECT_EQ(ErrorOf("policies:\n  - p\n"),
            "t.yaml:2: policies[0]: expected a policy (a map with name and limits), got \"p\"");
  EXPECT_EQ(ErrorOf("policies:\n  - name: p\n    limits: [gcra]\n"),
            "t.yaml:3: policies[0].limits[0]: expected a limit (a map with algorithm and rate), "
            "got \"gcra\"");
  EXPECT_EQ(ErrorOf("server:\n  listen: [127.0.0.1, 80]\n"),
            "t.yaml:2: server.listen: expected HOST:PORT such as 127.0.0.1:8080, got a list");
}

TEST(ConfigErrors, SecondYamlDocument) {
  EXPECT_EQ(ErrorOf("server: {}\n---\npolicies: []\n"),
            "t.yaml:3: a config file holds one YAML document; a second one starts here");
}

// ---- server ----

TEST(ConfigErrors, IntegersMustBeIntegersInRange) {
  EXPECT_EQ(ErrorOf("server:\n  threads: abc\n"),
            "t.yaml:2: server.threads: expected an integer, got \"abc\"");
  EXPECT_EQ(ErrorOf("server:\n  threads: 2.5\n"),
            "t.yaml:2: server.threads: expected an integer, got \"2.5\"");
  EXPECT_EQ(ErrorOf("server:\n  threads: -1\n"),
            "t.yaml:2: server.threads: must be from 0 to 256, got -1");
  EXPECT_EQ(ErrorOf("server:\n  threads: 257\n"),
            "t.yaml:2: server.threads: must be from 0 to 256, got 257");
  EXPECT_EQ(ErrorOf("server:\n  max_connections: 0\n"),
            "t.yaml:2: server.max_connections: must be at least 1, got 0");
  EXPECT_EQ(ErrorOf("server:\n  max_connections: 99999999999999999999\n"),
            "t.yaml:2: server.max_connections: \"99999999999999999999\" is too large");
  EXPECT_EQ(ErrorOf("server:\n  max_header_bytes: 1023\n"),
            "t.yaml:2: server.max_header_bytes: must be from 1024 to 1048576, got 1023");
  EXPECT_EQ(ErrorOf("server:\n  max_header_bytes: 1048577\n"),
            "t.yaml:2: server.max_header_bytes: must be from 1024 to 1048576, got 1048577");
  EXPECT_EQ(ErrorOf("server:\n  max_body_bytes: 67108865\n"),
            "t.yaml:2: server.max_body_bytes: must be from 0 to 67108864, got 67108865");
  EXPECT_EQ(ErrorOf("server:\n  max_body_bytes: -5\n"),
            "t.yaml:2: server.max_body_bytes: must be from 0 to 67108864, got -5");
  EXPECT_EQ(ErrorOf("server:\n  max_connections:\n"),
            "t.yaml:2: server.max_connections: expected an integer, got nothing");
}

TEST(ConfigErrors, TimeoutsArePositiveDurations) {
  EXPECT_EQ(ErrorOf("server:\n  read_timeout: 0s\n"),
            "t.yaml:2: server.read_timeout: must be longer than 0, got 0s");
  EXPECT_EQ(ErrorOf("server:\n  idle_timeout: 10\n"),
            "t.yaml:2: server.idle_timeout: duration \"10\": missing unit (one of us, ms, s, m or "
            "min, h, d)");
  EXPECT_EQ(ErrorOf("server:\n  upstream_timeout: -1s\n"),
            "t.yaml:2: server.upstream_timeout: duration \"-1s\": must not be negative");
  EXPECT_THAT(ErrorOf("server:\n  drain_timeout: 3 weeks\n"),
              StartsWith("t.yaml:2: server.drain_timeout: duration \"3 weeks\": unknown unit"));
}

TEST(ConfigErrors, BooleansAreTrueOrFalse) {
  EXPECT_EQ(ErrorOf("server:\n  access_log: maybe\n"),
            "t.yaml:2: server.access_log: expected true or false, got \"maybe\"");
}

TEST(ConfigErrors, ListenAddressesAreHostPort) {
  EXPECT_EQ(
      ErrorOf("server:\n  listen: 127.0.0.1\n"),
      "t.yaml:2: server.listen: address \"127.0.0.1\": missing port (expected HOST:PORT, e.g. "
      "127.0.0.1:8080)");
  EXPECT_EQ(ErrorOf("server:\n  admin: 127.0.0.1:70000\n"),
            "t.yaml:2: server.admin: address \"127.0.0.1:70000\": port \"70000\" is not a number "
            "from 0 to 65535");
}

TEST(ConfigErrors, ListenAndAdminMustDiffer) {
  EXPECT_EQ(ErrorOf("server:\n  listen: 127.0.0.1:9000\n  admin: 127.0.0.1:9000\n"),
            "t.yaml:3: server.admin: same address as server.listen (127.0.0.1:9000); the admin "
            "listener needs an address of its own");
  EXPECT_EQ(ErrorOf("server:\n  listen: 127.0.0.1:9090\n"),
            "t.yaml:2: server.listen: same address as server.admin (127.0.0.1:9090); the admin "
            "listener needs an address of its own");
  EXPECT_EQ(ErrorOf("server: {listen: 127.0.0.1:0, admin: 127.0.0.1:0}\n"),
            "(loaded without error)");
}

TEST(ConfigErrors, GrpcConnectionLimitsAreBounded) {
  EXPECT_EQ(ErrorOf("grpc:\n  max_connections: 0\n"),
            "t.yaml:2: grpc.max_connections: must be from 1 to 1000000, got 0");
  EXPECT_EQ(ErrorOf("grpc:\n  max_connections: 1000001\n"),
            "t.yaml:2: grpc.max_connections: must be from 1 to 1000000, got 1000001");
  EXPECT_EQ(ErrorOf("grpc:\n  max_connections: many\n"),
            "t.yaml:2: grpc.max_connections: expected an integer, got \"many\"");
  EXPECT_EQ(ErrorOf("grpc:\n  handshake_timeout: 0s\n"),
            "t.yaml:2: grpc.handshake_timeout: must be longer than 0, got 0s");
  EXPECT_EQ(ErrorOf("grpc:\n  idle_timeout: 8d\n"),
            "t.yaml:2: grpc.idle_timeout: must be at most 7d, got 8d");
  EXPECT_EQ(ErrorOf("grpc:\n  max_connection_age: -1s\n"),
            "t.yaml:2: grpc.max_connection_age: duration \"-1s\": must not be negative");
  EXPECT_EQ(ErrorOf("grpc:\n  max_connection_age_grace: 10\n"),
            "t.yaml:2: grpc.max_connection_age_grace: duration \"10\": missing unit (one of us, "
            "ms, s, m or min, h, d)");
  EXPECT_EQ(ErrorOf("grpc:\n  max_conections: 10\n"),
            "t.yaml:2: grpc.max_conections: unknown key (expected one of: listen, max_connections, "
            "handshake_timeout, idle_timeout, max_connection_age, max_connection_age_grace, tls)");
  EXPECT_EQ(ErrorOf("grpc:\n  max_connections: 1\n  handshake_timeout: 1ms\n"
                    "  idle_timeout: 7d\n"),
            "(loaded without error)");
}

// ---- store, trusted_proxies ----

TEST(ConfigErrors, StoreMemoryMaxKeys) {
  EXPECT_EQ(ErrorOf("store:\n  memory:\n    max_keys: 0\n"),
            "t.yaml:3: store.memory.max_keys: must be at least 1, got 0");
  EXPECT_EQ(ErrorOf("store:\n  memory: 100\n"),
            "t.yaml:2: store.memory: expected a map of keys, got \"100\"");
}

TEST(ConfigErrors, TrustedProxiesAreNetworks) {
  EXPECT_EQ(ErrorOf("trusted_proxies:\n  - 127.0.0.1/32\n  - 10.0.0.0/40\n"),
            "t.yaml:3: trusted_proxies[1]: network \"10.0.0.0/40\": prefix length \"40\" is not a "
            "number from 0 to 32");
  EXPECT_EQ(ErrorOf("trusted_proxies: [localhost]\n"),
            "t.yaml:1: trusted_proxies[0]: network \"localhost\": \"localhost\" is not an IPv4 or "
            "IPv6 address");
}

TEST(Config, ClientIpPrefixIsTheTopLevelOnesUnlessAPolicySetsItsOwn) {
  const Config config = Load(R"(
client_ip_prefix: {ipv6: 56}
policies:
  - name: inherits
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: own
    client_ip_prefix: {ipv4: 24}
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  EXPECT_EQ(config.client_ip_prefix, (ClientIpPrefix{.ipv4 = 32, .ipv6 = 56}));
  EXPECT_EQ(config.policies[0].client_ip_prefix, (ClientIpPrefix{.ipv4 = 32, .ipv6 = 56}));
  // What a policy's map leaves out is the top-level's.
  EXPECT_EQ(config.policies[1].client_ip_prefix, (ClientIpPrefix{.ipv4 = 24, .ipv6 = 56}));
  EXPECT_EQ(Load("policies: [{name: p, limits: [{algorithm: gcra, rate: 1/s}]}]")
                .policies.at(0)
                .client_ip_prefix,
            (ClientIpPrefix{.ipv4 = 32, .ipv6 = 64}));
}

TEST(ConfigErrors, ClientIpPrefixLengths) {
  EXPECT_EQ(ErrorOf("client_ip_prefix: {ipv6: 0}\n"),
            "t.yaml:1: client_ip_prefix.ipv6: must be from 1 to 128, got 0");
  EXPECT_EQ(
      ErrorOf("policies: [{name: p, client_ip_prefix: {ipv7: 3}, limits: []}]\n"),
      "t.yaml:1: policies[0].client_ip_prefix.ipv7: unknown key (expected one of: ipv4, ipv6)");
  EXPECT_EQ(ErrorOf("client_ip_prefix: {ipv4: 33}\n"),
            "t.yaml:1: client_ip_prefix.ipv4: must be from 1 to 32, got 33");
  EXPECT_EQ(ErrorOf("client_ip_prefix: 64\n"),
            "t.yaml:1: client_ip_prefix: expected a map of keys, got \"64\"");
}

// ---- routes ----

TEST(ConfigErrors, RouteNeedsANameAndAnUpstream) {
  EXPECT_EQ(ErrorOf("routes:\n  - upstream: http://a:1\n"), "t.yaml:2: routes[0].name: required");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n"),
            "t.yaml:2: routes[0].upstream: required (http://HOST:PORT)");
  EXPECT_EQ(
      ErrorOf("routes:\n  - name: a b\n    upstream: http://a:1\n"),
      "t.yaml:2: routes[0].name: name \"a b\" may hold only letters, digits, '_', '.' and '-'");
}

// The name rule of every sluice file (docs/configuration.md, "Bounds").
TEST(ConfigErrors, ANameIs1To128Characters) {
  const std::string name128(128, 'r');
  const Config config = Load("routes:\n  - name: " + name128 + "\n    upstream: http://a:1\n");
  ASSERT_EQ(config.routes.size(), 1u);
  EXPECT_EQ(config.routes[0].name, name128);
  EXPECT_EQ(ErrorOf("routes:\n  - name: " + name128 + "r\n    upstream: http://a:1\n"),
            "t.yaml:2: routes[0].name: name is 129 characters long, the most is 128");
  EXPECT_EQ(ErrorOf("routes:\n  - name: \"\"\n    upstream: http://a:1\n"),
            "t.yaml:2: routes[0].name: must not be empty");
}

TEST(ConfigErrors, DuplicateRouteNameAtTheSecond) {
  EXPECT_EQ(ErrorOf("routes:\n"
                    "  - name: app\n"
                    "    upstream: http://a:1\n"
                    "  - name: app\n"
                    "    upstream: http://b:1\n"),
            "t.yaml:4: routes[1].name: duplicate route name \"app\" (first at line 2)");
}

TEST(ConfigRoutes, AnHttpsUpstream) {
  Config c = Load("routes:\n  - name: a\n    upstream: https://api.example.com\n");
  ASSERT_EQ(c.routes.size(), 1u);
  EXPECT_EQ(c.routes[0].upstream, (HostPort{"api.example.com", 443}));
  EXPECT_TRUE(c.routes[0].upstream_tls);
  EXPECT_EQ(c.routes[0].upstream_ca_file, "");
  c = Load("routes:\n  - name: a\n    upstream: HTTPS://10.0.0.7:8443\n");
  EXPECT_EQ(c.routes[0].upstream, (HostPort{"10.0.0.7", 8443}));
  EXPECT_TRUE(c.routes[0].upstream_tls);
  c = Load("routes:\n  - name: a\n    upstream: http://10.0.0.7\n");
  EXPECT_EQ(c.routes[0].upstream, (HostPort{"10.0.0.7", 80}));
  EXPECT_FALSE(c.routes[0].upstream_tls);
  c = Load("routes:\n  - name: a\n    upstream: https://a\n    upstream_ca_file: /dev/null\n");
  EXPECT_EQ(c.routes[0].upstream_ca_file, "/dev/null");
  EXPECT_FALSE(c.routes[0].upstream_host);
  c = Load("routes:\n  - name: a\n    upstream: https://a\n    host_header: upstream\n");
  EXPECT_TRUE(c.routes[0].upstream_host);
  EXPECT_FALSE(c.routes[0].websocket);
  c = Load("routes:\n  - name: a\n    upstream: http://a\n    websocket: true\n");
  EXPECT_TRUE(c.routes[0].websocket);
  EXPECT_EQ(c.routes[0].upstream_timeout, Duration::Zero());  // the server's
  c = Load("routes:\n  - name: a\n    upstream: http://a\n    upstream_timeout: 5m\n");
  EXPECT_EQ(c.routes[0].upstream_timeout, Duration::Minutes(5));
  EXPECT_EQ(c.routes[0].idle_timeout, Duration::Zero());  // the server's
  EXPECT_EQ(c.routes[0].max_body_bytes, std::nullopt);    // the server's
  c = Load("routes:\n  - {name: a, upstream: http://a, max_body_bytes: 1099511627776}\n");
  EXPECT_EQ(c.routes[0].max_body_bytes, int64_t{1} << 40);
  EXPECT_THAT(
      ErrorOf("routes:\n  - {name: a, upstream: http://a, max_body_bytes: 1099511627777}\n"),
      HasSubstr("routes[0].max_body_bytes"));
  // A route that streams uploads renews their slots as their parts come,
  // server.read_timeout apart at most.
  EXPECT_THAT(ErrorOf("server: {read_timeout: 2m}\nroutes:\n  - {name: up, upstream: http://a, "
                      "max_body_bytes: 10000000}\npolicies:\n  - name: p\n"
                      "    limits: [{algorithm: concurrency, limit: 1}]\n"),
              HasSubstr("lease_ttl 1m must be longer than server.read_timeout (routes \"up\" "
                        "streams uploads) (2m)"));
  // A floor on an upload's rate: where uploads stream alone.
  EXPECT_EQ(c.routes[0].min_upload_rate, std::nullopt);  // kDefaultMinUploadRate
  c = Load(
      "routes:\n  - {name: a, upstream: http://a, max_body_bytes: 10000000, "
      "min_upload_rate: 0}\n");
  EXPECT_EQ(c.routes[0].min_upload_rate, 0);
  c = Load(
      "routes:\n  - {name: a, upstream: http://a, max_body_bytes: 10000000, "
      "min_upload_rate: 65536}\n");
  EXPECT_EQ(c.routes[0].min_upload_rate, 65536);
  EXPECT_EQ(ErrorOf("routes:\n  - {name: a, upstream: http://a, min_upload_rate: 100}\n"),
            "t.yaml:2: routes[0].min_upload_rate: only for a route whose max_body_bytes is larger "
            "than server.max_body_bytes (1048576): its uploads stream; a body read whole has "
            "server.read_timeout in all");
  EXPECT_THAT(ErrorOf("routes:\n  - {name: a, upstream: http://a, max_body_bytes: 10000000, "
                      "min_upload_rate: -1}\n"),
              HasSubstr("routes[0].min_upload_rate: must be from 0 to"));
  c = Load("routes:\n  - {name: a, upstream: http://a, websocket: true, idle_timeout: 10m}\n");
  EXPECT_EQ(c.routes[0].idle_timeout, Duration::Minutes(10));
  EXPECT_EQ(ErrorOf("routes:\n  - {name: a, upstream: http://a, idle_timeout: 10m}\n"),
            "t.yaml:2: routes[0].idle_timeout: only for a route with websocket: true (a tunnel's "
            "quiet time); a connection's between requests is server.idle_timeout");
  EXPECT_EQ(ErrorOf("routes:\n  - {name: a, upstream: http://a, websocket: true, idle_timeout: "
                    "0s}\n"),
            "t.yaml:2: routes[0].idle_timeout: must be longer than 0, got 0s");
  // A concurrency slot must outlive the longest wait for an upstream.
  EXPECT_EQ(ErrorOf("routes:\n  - name: sse\n    upstream: http://a\n    upstream_timeout: 5m\n"
                    "policies:\n  - name: p\n    limits: [{algorithm: concurrency, limit: 1}]\n"),
            "t.yaml:6: policies[0]: policy \"p\": lease_ttl 1m must be longer than routes \"sse\" "
            "upstream_timeout (5m), or a slow answer's slot would end before it");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a\n    websocket: sometimes\n"),
            "t.yaml:4: routes[0].websocket: expected true or false, got \"sometimes\"");
  c = Load(
      "routes:\n  - name: a\n    upstream: https://10.0.0.7\n    upstream_server_name: "
      "billing.internal\n");
  EXPECT_EQ(c.routes[0].upstream_server_name, "billing.internal");
  c = Load(
      "routes:\n  - name: a\n    upstream: https://10.0.0.7\n    upstream_cert_file: /dev/null\n"
      "    upstream_key_file: /dev/null\n");
  EXPECT_EQ(c.routes[0].upstream_cert_file, "/dev/null");
  EXPECT_EQ(c.routes[0].upstream_key_file, "/dev/null");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: https://a\n    upstream_cert_file: "
                    "/dev/null\n"),
            "t.yaml:4: routes[0].upstream_cert_file: give upstream_cert_file and upstream_key_file "
            "together (sluice's certificate for the upstream and its key)");
  EXPECT_EQ(
      ErrorOf("routes:\n  - name: a\n    upstream: http://a\n    upstream_key_file: "
              "/dev/null\n"),
      "t.yaml:4: routes[0].upstream_key_file: the upstream is plain (http://): write https:// "
      "for TLS");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a\n    upstream_server_name: b\n"),
            "t.yaml:4: routes[0].upstream_server_name: the upstream is plain (http://): write "
            "https:// for TLS");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: https://a\n    host_header: a.example\n"),
            "t.yaml:4: routes[0].host_header: expected client (the client's Host) or upstream (the "
            "upstream's name), got \"a.example\"");
}

TEST(ConfigErrors, UpstreamIsHttpOrHttpsHostPort) {
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: 127.0.0.1:3000\n"),
            "t.yaml:3: routes[0].upstream: expected http://HOST:PORT or https://HOST:PORT, got "
            "\"127.0.0.1:3000\"");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a:1/api\n"),
            "t.yaml:3: routes[0].upstream: upstream \"http://a:1/api\": a path, query or fragment "
            "is not supported (only http://HOST:PORT)");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a\n    upstream_ca_file: "
                    "/dev/null\n"),
            "t.yaml:4: routes[0].upstream_ca_file: the upstream is plain (http://): write https:// "
            "for TLS");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: https://a\n    upstream_ca_file: "
                    "/nonexistent/ca.pem\n"),
            "t.yaml:4: routes[0].upstream_ca_file: /nonexistent/ca.pem: cannot read: No such file "
            "or directory");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a:0\n"),
            "t.yaml:3: routes[0].upstream: upstream \"http://a:0\": port 0 cannot be connected to");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a:x\n"),
            "t.yaml:3: routes[0].upstream: upstream \"http://a:x\": address \"a:x\": port \"x\" is "
            "not a number from 0 to 65535");
}

TEST(ConfigErrors, MatchRules) {
  EXPECT_EQ(
      ErrorOf("routes:\n  - name: a\n    upstream: http://a:1\n    match: {path_prefix: api}\n"),
      "t.yaml:4: routes[0].match.path_prefix: must start with '/', got \"api\"");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a:1\n    match: {path: /a, "
                    "path_prefix: /}\n"),
            "t.yaml:4: routes[0].match.path: set path (exact) or path_prefix, not both");
  EXPECT_EQ(
      ErrorOf(
          "routes:\n  - name: a\n    upstream: http://a:1\n    match: {host: \"a.com:8080\"}\n"),
      "t.yaml:4: routes[0].match.host: host \"a.com:8080\" is matched without its port; drop "
      "the \":...\"");
  EXPECT_EQ(
      ErrorOf("routes:\n  - name: a\n    upstream: http://a:1\n    match: {method: \"GE T\"}\n"),
      "t.yaml:4: routes[0].match.method: \"GE T\" is not an HTTP method");
  EXPECT_EQ(ErrorOf("routes:\n  - name: a\n    upstream: http://a:1\n    match:\n      headers: "
                    "[\"X Foo\"]\n"),
            "t.yaml:5: routes[0].match.headers[0]: \"X Foo\" is not a header name");
}

// ---- policies ----

TEST(ConfigErrors, PolicyNeedsNameAndLimits) {
  EXPECT_EQ(ErrorOf("policies:\n  - limits: [{algorithm: gcra, rate: 1/s}]\n"),
            "t.yaml:2: policies[0].name: required");
  EXPECT_EQ(ErrorOf("policies:\n  - name: p\n"),
            "t.yaml:2: policies[0].limits: required: a policy needs at least one limit");
  EXPECT_EQ(ErrorOf("policies:\n  - name: p\n    limits: []\n"),
            "t.yaml:3: policies[0].limits: must not be empty: a policy needs at least one limit");
  EXPECT_EQ(
      ErrorOf("policies:\n  - name: \"lo\\\"gin\"\n    limits: [{algorithm: gcra, rate: 1/s}]\n"),
      "t.yaml:2: policies[0].name: name \"lo\"gin\" may hold only letters, digits, '_', '.' "
      "and '-'");
}

TEST(ConfigErrors, DuplicatePolicyNameAtTheSecond) {
  EXPECT_EQ(ErrorOf("policies:\n"
                    "  - name: login\n"
                    "    limits: [{algorithm: gcra, rate: 1/s}]\n"
                    "  - name: other\n"
                    "    limits: [{algorithm: gcra, rate: 1/s}]\n"
                    "  - name: login\n"
                    "    limits: [{algorithm: gcra, rate: 2/s}]\n"),
            "t.yaml:6: policies[2].name: duplicate policy name \"login\" (first at line 2)");
}

TEST(ConfigErrors, KeyParts) {
  const auto with_key = [](std::string_view key) {
    return ErrorOf(
        std::string("policies:\n  - name: p\n    limits: [{algorithm: gcra, rate: 1/s}]\n"
                    "    key: ") +
        std::string(key) + "\n");
  };
  EXPECT_EQ(
      with_key("[]"),
      "t.yaml:4: policies[0].key: must not be empty (leave key out for the default [client_ip])");
  EXPECT_EQ(with_key("[client_ip, user]"),
            "t.yaml:4: policies[0].key[1]: unknown key part \"user\" (expected client_ip, "
            "header:NAME, path, route, client_cert or global)");
  EXPECT_EQ(with_key("[\"header:\"]"),
            "t.yaml:4: policies[0].key[0]: \"\" in \"header:\" is not a header name");
  EXPECT_EQ(with_key("[header: X-Api-Key]"),
            "t.yaml:4: policies[0].key[0]: expected a key part, got a map: write header:NAME "
            "without a space after the colon, or quote it");
  EXPECT_EQ(with_key("[global, client_ip]"),
            "t.yaml:4: policies[0].key: global is a whole key (one bucket for every request); it "
            "does not combine with other parts");
  EXPECT_EQ(with_key("[path, path]"),
            "t.yaml:4: policies[0].key[1]: key part \"path\" appears twice");
  EXPECT_EQ(with_key("client_ip"),
            "t.yaml:4: policies[0].key: expected a list of key parts, got \"client_ip\" (write "
            "[client_ip])");
}

TEST(ConfigErrors, PolicyChoices) {
  const auto with = [](std::string_view line) {
    return ErrorOf(
        std::string("policies:\n  - name: p\n    limits: [{algorithm: gcra, rate: 1/s}]\n    ") +
        std::string(line) + "\n");
  };
  EXPECT_EQ(
      with("on_missing_key: allow"),
      "t.yaml:4: policies[0].on_missing_key: expected one of: deny, client_ip; got \"allow\"");
  EXPECT_EQ(with("on_store_error: ignore"),
            "t.yaml:4: policies[0].on_store_error: expected one of: allow, deny, local; got "
            "\"ignore\"");
  EXPECT_EQ(with("shadow: sometimes"),
            "t.yaml:4: policies[0].shadow: expected true or false, got \"sometimes\"");
  EXPECT_EQ(with("on_deny: {status: 200}"),
            "t.yaml:4: policies[0].on_deny.status: must be from 400 to 599, got 200");
  EXPECT_EQ(with("on_deny: {status: 600}"),
            "t.yaml:4: policies[0].on_deny.status: must be from 400 to 599, got 600");
  EXPECT_EQ(
      with("on_deny: {retry_after_jitter: soon}"),
      "t.yaml:4: policies[0].on_deny.retry_after_jitter: duration \"soon\": expected a number "
      "followed by a unit, e.g. 250ms, 2s, 5m");
  EXPECT_EQ(with("on_deny: {retry_after_jitter: 0s}"), "(loaded without error)");
}

// ---- limits ----

std::string LimitError(std::string_view second_limit) {
  return ErrorOf(std::string("policies:\n"
                             "  - name: login\n"
                             "    limits:\n"
                             "      - {algorithm: token_bucket, rate: 40/s}\n"
                             "      - ") +
                 std::string(second_limit) + "\n");
}

TEST(LimitErrors, GlobalScopeNeedsASharedStore) {
  EXPECT_EQ(LimitError("{algorithm: sliding_window, rate: 300/min, scope: global}"),
            "t.yaml:5: policies[0].limits[1].scope: global needs a shared store (store.redis), "
            "none is configured");
  EXPECT_EQ(LimitError("{algorithm: sliding_window, rate: 300/min, scope: everywhere}"),
            "t.yaml:5: policies[0].limits[1].scope: expected one of: local, global; got "
            "\"everywhere\"");
}

TEST(LimitErrors, AlgorithmIsRequiredAndKnown) {
  EXPECT_EQ(LimitError("{rate: 1/s}"), "t.yaml:5: policies[0].limits[1].algorithm: required");
  EXPECT_EQ(LimitError("{algorithm: token-bucket, rate: 1/s}"),
            "t.yaml:5: policies[0].limits[1].algorithm: unknown algorithm \"token-bucket\" "
            "(expected one of: token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, "
            "sliding_window, concurrency)");
}

TEST(LimitErrors, RateOrLimitAndPeriod) {
  EXPECT_EQ(LimitError("{algorithm: gcra}"),
            "t.yaml:5: policies[0].limits[1].rate: required (a rate such as 100/s, or limit + "
            "period)");
  EXPECT_EQ(LimitError("{algorithm: gcra, rate: 1/s, limit: 1}"),
            "t.yaml:5: policies[0].limits[1].limit: set rate or limit + period, not both");
  EXPECT_EQ(LimitError("{algorithm: gcra, limit: 10}"),
            "t.yaml:5: policies[0].limits[1].period: required with limit");
  EXPECT_EQ(LimitError("{algorithm: gcra, period: 1m}"),
            "t.yaml:5: policies[0].limits[1].limit: required with period");
  EXPECT_EQ(LimitError("{algorithm: gcra, limit: 0, period: 1m}"),
            "t.yaml:5: policies[0].limits[1].limit: must be from 1 to 1099511627776, got 0");
  EXPECT_EQ(LimitError("{algorithm: gcra, limit: 5, period: 400d}"),
            "t.yaml:5: policies[0].limits[1].period: rate period 400d is longer than the maximum "
            "366d");
  EXPECT_EQ(LimitError("{algorithm: gcra, rate: 40}"),
            "t.yaml:5: policies[0].limits[1].rate: rate \"40\": expected LIMIT/PERIOD, e.g. 100/s, "
            "40/min, 10/5s");
}

TEST(LimitErrors, LimitAndPeriodMeanTheSameAsRate) {
  const Config a = Load(
      "policies:\n  - name: p\n    limits: [{algorithm: fixed_window, limit: 40, period: 1m}]\n");
  const Config b =
      Load("policies:\n  - name: p\n    limits: [{algorithm: fixed_window, rate: 40/min}]\n");
  EXPECT_EQ(a.policies[0].limits, b.policies[0].limits);
}

TEST(LimitErrors, MakeLimitErrorsCarryTheLimitsLocation) {
  EXPECT_EQ(LimitError("{algorithm: fixed_window, rate: 10/s, burst: 5}"),
            "t.yaml:5: policies[0].limits[1]: fixed_window: burst applies only to token_bucket, "
            "gcra and leaky_bucket mode police (a window's limit is its rate)");
  EXPECT_EQ(LimitError("{algorithm: token_bucket, rate: 10/s, max_delay: 1s}"),
            "t.yaml:5: policies[0].limits[1]: token_bucket: max_delay and queue apply only to "
            "leaky_bucket mode shape");
}

TEST(LimitErrors, FieldsOfTheirOwn) {
  EXPECT_EQ(LimitError("{algorithm: token_bucket, rate: 10/s, burst: 0}"),
            "t.yaml:5: policies[0].limits[1].burst: must be from 1 to 1099511627776, got 0");
  EXPECT_EQ(LimitError("{algorithm: token_bucket, rate: 10/s, burst: -3}"),
            "t.yaml:5: policies[0].limits[1].burst: must be from 1 to 1099511627776, got -3");
  EXPECT_EQ(LimitError("{algorithm: gcra, rate: 10/s, mode: shape}"),
            "t.yaml:5: policies[0].limits[1].mode: mode applies only to leaky_bucket, not gcra");
  EXPECT_EQ(LimitError("{algorithm: leaky_bucket, rate: 10/s, mode: queue}"),
            "t.yaml:5: policies[0].limits[1].mode: expected one of: police, shape; got \"queue\"");
  EXPECT_EQ(LimitError("{algorithm: leaky_bucket, mode: shape, rate: 10/s, queue: -1}"),
            "t.yaml:5: policies[0].limits[1].queue: must be from 0 to 1099511627776, got -1");
}

// burst and queue are bounded by kMaxLimit (2^40), as a rate's limit is and
// as in a scenario; the algorithms take that much.
TEST(LimitErrors, BurstAndQueueAreAtMost2To40) {
  const Config config = Load(
      "policies:\n  - name: p\n    limits:\n"
      "      - {algorithm: token_bucket, rate: 1000000/s, burst: 1099511627776}\n"
      "      - {algorithm: leaky_bucket, mode: shape, rate: 1000000/s, queue: 1099511627776}\n");
  ASSERT_EQ(config.policies.size(), 1u);
  EXPECT_EQ(config.policies[0].limits[0].options.burst, kMaxLimit);
  EXPECT_EQ(config.policies[0].limits[1].options.queue, kMaxLimit);
  EXPECT_EQ(LimitError("{algorithm: token_bucket, rate: 1000000/s, burst: 1099511627777}"),
            "t.yaml:5: policies[0].limits[1].burst: must be from 1 to 1099511627776, got "
            "1099511627777");
  EXPECT_EQ(LimitError("{algorithm: leaky_bucket, mode: shape, rate: 10/s, queue: 1099511627777}"),
            "t.yaml:5: policies[0].limits[1].queue: must be from 0 to 1099511627776, got "
            "1099511627777");
}

TEST(LimitErrors, AtMostOneShapeLimitPerPolicy) {
  EXPECT_EQ(ErrorOf("policies:\n"
                    "  - name: import\n"
                    "    limits:\n"
                    "      - {algorithm: leaky_bucket, mode: shape, rate: 10/s}\n"
                    "      - {algorithm: token_bucket, rate: 40/s}\n"
                    "      - {algorithm: leaky_bucket, mode: shape, rate: 5/s}\n"),
            "t.yaml:6: policies[0].limits[2]: at most one leaky_bucket shape limit per policy "
            "(limits[0] is one already)");
}

TEST(LimitErrors, BlockStyleLimitsReportTheirOwnLines) {
  EXPECT_EQ(ErrorOf("policies:\n"
                    "  - name: api\n"
                    "    limits:\n"
                    "      - algorithm: gcra\n"
                    "        rate: 100/s\n"
                    "      - algorithm: sliding_window\n"
                    "        rate: 1000/min\n"
                    "        scope: global\n"),
            "t.yaml:8: policies[0].limits[1].scope: global needs a shared store (store.redis), "
            "none is configured");
}

// ---- files ----

TEST(DecisionConfig, DefaultsToNoListenerAndNoTokens) {
  const Config config = Load("");
  EXPECT_EQ(config.server.decision.listen, std::nullopt);
  EXPECT_FALSE(config.server.decision.on_gateway_listener);
  EXPECT_TRUE(config.server.decision.tokens.empty());
}

TEST(DecisionConfig, ReadsListenTokensAndTokenEnv) {
  ::setenv("SLUICE_TEST_TOKENS", "tok-from-env-0123456789, second-token-abcdefgh", 1);
  const Config config = Load(
      "server:\n  decision:\n    listen: 127.0.0.1:0\n"
      "    tokens: [a-token-of-16-chars]\n    token_env: SLUICE_TEST_TOKENS\n");
  ::unsetenv("SLUICE_TEST_TOKENS");
  EXPECT_EQ(config.server.decision.listen, (HostPort{"127.0.0.1", 0}));
  EXPECT_EQ(config.server.decision.tokens,
            (std::vector<std::string>{"a-token-of-16-chars", "tok-from-env-0123456789",
                                      "second-token-abcdefgh"}));
}

TEST(DecisionConfig, RefusesWeakTokensAndClashingAddresses) {
  EXPECT_EQ(
      ErrorOf("server:\n  decision:\n    tokens: [short]\n"),
      "t.yaml:3: server.decision.tokens[0]: a token must be 16 to 512 characters long, got 5");
  EXPECT_EQ(ErrorOf("server:\n  decision:\n    tokens: [\"has a space in it, sixteen\"]\n"),
            "t.yaml:3: server.decision.tokens[0]: a token may hold only visible ASCII characters, "
            "no spaces or commas");
  EXPECT_EQ(ErrorOf("server:\n  decision:\n    token_env: SLUICE_TEST_NO_SUCH_VARIABLE\n"),
            "t.yaml:3: server.decision.token_env: the environment has no "
            "SLUICE_TEST_NO_SUCH_VARIABLE (or it is empty)");
  EXPECT_EQ(ErrorOf("server:\n  listen: 127.0.0.1:8080\n  decision: {listen: 127.0.0.1:8080}\n"),
            "t.yaml:3: server.decision.listen: same address as server.listen; the decision API "
            "needs an address of its own");
  EXPECT_EQ(ErrorOf("server:\n  decision: {listen: 127.0.0.1:1, on_gateway_listener: true}\n"),
            "t.yaml:2: server.decision.on_gateway_listener: give listen (a listener of its own) "
            "or on_gateway_listener, not both");
}

TEST(RealIpHeader, DefaultsToXForwardedForAndNeedsTrustedProxies) {
  EXPECT_EQ(Load("").real_ip_header, "x-forwarded-for");
  EXPECT_EQ(Load("trusted_proxies: [127.0.0.1]\nreal_ip_header: X-Real-IP\n").real_ip_header,
            "x-real-ip");
  EXPECT_EQ(ErrorOf("real_ip_header: X-Real-IP\n"),
            "t.yaml:1: real_ip_header: needs trusted_proxies: the header is believed only from "
            "those peers");
  EXPECT_EQ(ErrorOf("trusted_proxies: [127.0.0.1]\nreal_ip_header: \"X Real\"\n"),
            "t.yaml:2: real_ip_header: \"X Real\" is not a header name");
}

TEST(ConfigErrors, AQuoteNeverClosedIsRefused) {
  EXPECT_EQ(ErrorOf("policies:\n  - name: 'p\n    limits: [{algorithm: gcra, rate: 1/s}]\n"),
            "t.yaml:2:11: a quoted value starts here and its ' is never closed");
}

TEST(LongKeys, HashByDefaultOrRefuse) {
  const Config config = Load(
      "policies:\n  - {name: a, limits: [{algorithm: gcra, rate: 1/s}]}\n"
      "  - {name: b, long_keys: refuse, limits: [{algorithm: gcra, rate: 1/s}]}\n");
  EXPECT_EQ(config.policies[0].long_keys, LongKeys::kHash);
  EXPECT_EQ(config.policies[1].long_keys, LongKeys::kRefuse);
  EXPECT_EQ(
      ErrorOf("policies:\n  - {name: a, long_keys: cut, limits: [{algorithm: gcra, rate: 1/s}]}\n"),
      "t.yaml:2: policies[0].long_keys: expected one of: hash, refuse; got \"cut\"");
}

TEST(ServerTimeouts, HugeValuesAreRefusedWithTheBound) {
  // 200000 days would overflow a deadline on the steady clock.
  EXPECT_EQ(ErrorOf("server:\n  drain_timeout: 200000d\n"),
            "t.yaml:2: server.drain_timeout: must be at most 7d, got 200000d");
  EXPECT_EQ(Load("server:\n  drain_timeout: 7d\n").server.drain_timeout, Duration::Days(7));
}

TEST(EmptyConfig, IsValidAtStartAndRefusedWhenAskedTo) {
  EXPECT_TRUE(ParseConfig("# nothing yet\n", "t.yaml").ok());
  const absl::StatusOr<Config> empty = ParseConfig("", "t.yaml", {.allow_empty = false});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(),
            "t.yaml: the file is empty (or holds only comments); the config in force stays (an "
            "editor rewriting the file can leave it empty for a moment)");
  EXPECT_FALSE(ParseConfig("  # only a comment\n\n", "t.yaml", {.allow_empty = false}).ok());
}

TEST(LoadConfigFile, MissingFileNamesPathAndReason) {
  const absl::StatusOr<Config> config = LoadConfigFile("/nonexistent/sluice.yaml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(config.status().message(),
            "/nonexistent/sluice.yaml: cannot read: No such file or directory");
}

TEST(LoadConfigFile, ErrorsNameTheFile) {
  const std::string path = testing::TempDir() + "/sluice_config_test.yaml";
  {
    std::ofstream out(path);
    out << "server:\n  threads: 2\npolicies:\n  - name: p\n    limits: [{algorithm: gcra, rate: "
           "0/s}]\n";
  }
  const absl::StatusOr<Config> config = LoadConfigFile(path);
  std::remove(path.c_str());
  EXPECT_EQ(
      config.status().message(),
      path + ":5: policies[0].limits[0].rate: rate \"0/s\": rate limit must be at least 1, got 0");
}

TEST(LoadConfigFile, QuickstartExampleLoads) {
  const std::string path = std::string(SLUICE_SOURCE_DIR) + "/examples/quickstart.yaml";
  const absl::StatusOr<Config> config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->source, path);
  EXPECT_EQ(config->server.listen, (HostPort{"127.0.0.1", 8080}));
  EXPECT_EQ(config->server.admin, (HostPort{"127.0.0.1", 9090}));
  ASSERT_EQ(config->policies.size(), 3u);
  EXPECT_EQ(config->policies[0].name, "login");
  EXPECT_EQ(config->policies[0].limits.size(), 2u);
  EXPECT_EQ(config->policies[1].name, "api");
  EXPECT_THAT(config->policies[1].key, ElementsAre(Part(KeyPart::Kind::kHeader, "x-api-key")));
  EXPECT_EQ(config->policies[1].on_missing_key, MissingKey::kClientIp);
  EXPECT_EQ(config->policies[2].name, "search");
  EXPECT_EQ(config->policies[2].limits[0].options.algorithm, Algorithm::kFixedWindow);
  EXPECT_TRUE(config->routes.empty());
}

TEST(LoadConfigFile, GatewayExampleLoads) {
  const std::string path = std::string(SLUICE_SOURCE_DIR) + "/examples/gateway.yaml";
  const absl::StatusOr<Config> config = LoadConfigFile(path);
  ASSERT_TRUE(config.ok()) << config.status().message();
  ASSERT_FALSE(config->routes.empty());
  for (const RouteConfig& route : config->routes) {
    EXPECT_EQ(route.upstream, (HostPort{"127.0.0.1", 3000}));
  }
  EXPECT_FALSE(config->trusted_proxies.empty());
  bool shape = false;
  bool shadow = false;
  for (const PolicyConfig& policy : config->policies) {
    EXPECT_TRUE(policy.match.has_value()) << policy.name;
    shadow |= policy.shadow;
    for (const LimitSpec& limit : policy.limits) {
      shape |= limit.options.algorithm == Algorithm::kLeakyBucket &&
               limit.options.mode == LeakyMode::kShape;
    }
  }
  EXPECT_TRUE(shape);
  EXPECT_TRUE(shadow);
}

}  // namespace
}  // namespace sluice
