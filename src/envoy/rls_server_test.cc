// The Envoy rate limit service over real gRPC: a client built from the same
// protos calls ShouldRateLimit on a server bound to a free loopback port,
// with the rules of tests/envoy/ (envoyproxy/ratelimit files, unchanged)
// and a manual clock, and checks every field of every answer.
#include "envoy/rls_server.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "envoy/grpc_test_support.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "metrics/metrics.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/envoy_config.h"
#include "sluice/store/memory_store.h"
#include "store/memory/remote_test_support.h"

namespace sluice::envoy {
namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using ::testing::HasSubstr;
using Response = rls::RateLimitResponse;
using Entries = std::vector<std::pair<std::string, std::string>>;

// A multiple of every unit up to a day: windows start exactly now.
constexpr int64_t kStartSeconds = 1'700'006'400;

class RlsTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(SLUICE_SOURCE_DIR "/tests/envoy/sluice.yaml"); }

  void Start(const std::string& path) {
    absl::StatusOr<Config> config = LoadConfigFile(path);
    ASSERT_TRUE(config.ok()) << config.status();
    StartWith(*config);
  }
  void StartWith(const Config& config, Store* shared = nullptr, std::function<bool()> ready = {}) {
    server_.reset();
    absl::StatusOr<std::unique_ptr<RlsServer>> server = RlsServer::Start(
        config, {.local = &store_, .shared = shared, .clock = &clock_, .metrics = &metrics_},
        std::move(ready));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rls::RateLimitService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }

  static rls::RateLimitRequest Request(const std::string& domain, const std::vector<Entries>& ds,
                                       uint32_t hits_addend = 0) {
    rls::RateLimitRequest r;
    r.set_domain(domain);
    r.set_hits_addend(hits_addend);
    for (const Entries& d : ds) {
      auto* descriptor = r.add_descriptors();
      for (const auto& [k, v] : d) {
        auto* e = descriptor->add_entries();
        e->set_key(k);
        e->set_value(v);
      }
    }
    return r;
  }

  grpc::Status Call(const rls::RateLimitRequest& request, Response& response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->ShouldRateLimit(&context, request, &response);
  }
  Response Ok(const rls::RateLimitRequest& request) {
    Response response;
    const grpc::Status s = Call(request, response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }
  Response Ok(const std::string& domain, const std::vector<Entries>& ds, uint32_t hits = 0) {
    return Ok(Request(domain, ds, hits));
  }
  std::string Header(const Response& r, std::string_view name) {
    for (const auto& h : r.response_headers_to_add()) {
      if (h.key() == name) return h.value();
    }
    return "(absent)";
  }

  ManualClock clock_{Time::FromUnixMicros(kStartSeconds * 1'000'000)};
  MemoryStore store_;
  metrics::Metrics metrics_;
  std::unique_ptr<RlsServer> server_;
  std::unique_ptr<rls::RateLimitService::Stub> stub_;
};

TEST_F(RlsTest, PerValueLimitOkThenOverLimitWithEveryField) {
  for (uint32_t remaining : {2u, 1u, 0u}) {
    const Response r = Ok("edge", {{{"remote_address", "10.0.0.1"}}});
    EXPECT_EQ(r.overall_code(), Response::OK);
    ASSERT_EQ(r.statuses_size(), 1);
    const auto& s = r.statuses(0);
    EXPECT_EQ(s.code(), Response::OK);
    EXPECT_EQ(s.current_limit().requests_per_unit(), 3u);
    EXPECT_EQ(s.current_limit().unit(), Response::RateLimit::MINUTE);
    EXPECT_EQ(s.current_limit().name(), "");
    EXPECT_EQ(s.limit_remaining(), remaining);
    EXPECT_EQ(s.duration_until_reset().seconds(), 60);  // the minute window started now
    EXPECT_EQ(Header(r, "RateLimit-Policy"), "\"edge.remote_address\";q=3;w=60");
    EXPECT_EQ(Header(r, "RateLimit"),
              "\"edge.remote_address\";r=" + std::to_string(remaining) + ";t=60");
    EXPECT_EQ(Header(r, "Retry-After"), "(absent)");
    EXPECT_TRUE(r.raw_body().empty());
  }
  clock_.Advance(Duration::Seconds(20));
  const Response over = Ok("edge", {{{"remote_address", "10.0.0.1"}}});
  EXPECT_EQ(over.overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).code(), Response::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(over.statuses(0).duration_until_reset().seconds(), 40);
  EXPECT_EQ(Header(over, "RateLimit"), "\"edge.remote_address\";r=0;t=40");
  // Retry-After: never earlier than the window's end, at most a tenth of it later (jitter).
  const int retry = std::stoi(Header(over, "Retry-After"));
  EXPECT_GE(retry, 40);
  EXPECT_LE(retry, 46);
  EXPECT_EQ(Header(over, "Content-Type"), "application/problem+json");
  EXPECT_THAT(over.raw_body(), HasSubstr("\"title\":\"quota-exceeded\""));
  EXPECT_THAT(over.raw_body(), HasSubstr("\"violated-policies\":[\"edge.remote_address\"]"));

  // Another value has its own state; the first is free again in the next window.
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.0.0.2"}}}).overall_code(), Response::OK);
  clock_.Advance(Duration::Seconds(40));
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.0.0.1"}}}).statuses(0).limit_remaining(), 2u);
}

TEST_F(RlsTest, UnknownDomainAndDescriptorsAreOkWithoutALimit) {
  for (const Response& r :
       {Ok("nowhere", {{{"remote_address", "10.0.0.1"}}}), Ok("edge", {{{"user_agent", "curl"}}}),
        Ok("edge", {{{"path", "/other"}}})}) {
    EXPECT_EQ(r.overall_code(), Response::OK);
    ASSERT_EQ(r.statuses_size(), 1);
    EXPECT_EQ(r.statuses(0).code(), Response::OK);
    EXPECT_FALSE(r.statuses(0).has_current_limit());
    EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
    EXPECT_EQ(r.response_headers_to_add_size(), 0);
  }
}

TEST_F(RlsTest, ExactValueBeatsAnyValueAndZeroDeniesEverything) {
  const Response r = Ok("edge", {{{"remote_address", "50.0.0.5"}}});
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 0u);
  EXPECT_EQ(r.statuses(0).current_limit().unit(), Response::RateLimit::SECOND);
  EXPECT_EQ(r.statuses(0).duration_until_reset().seconds(), 1);
  // It can never pass: no Retry-After that would lie, and no t= in RateLimit.
  EXPECT_EQ(Header(r, "Retry-After"), "(absent)");
  EXPECT_EQ(Header(r, "RateLimit"), "\"edge.remote_address_50.0.0.5\";r=0");
  EXPECT_THAT(r.raw_body(), HasSubstr("can never pass"));
}

TEST_F(RlsTest, UnlimitedNeverLimits) {
  for (int i = 0; i < 50; ++i) {
    const Response r = Ok("edge", {{{"path", "/health"}}});
    EXPECT_EQ(r.overall_code(), Response::OK);
    EXPECT_FALSE(r.statuses(0).has_current_limit());
    EXPECT_EQ(r.statuses(0).limit_remaining(), 4294967295u);
  }
}

TEST_F(RlsTest, NestedDescriptorsMatchOnlyAtTheirDepth) {
  const std::vector<Entries> login = {{{"path", "/login"}, {"remote_address", "10.0.0.9"}}};
  EXPECT_EQ(Ok("edge", login).statuses(0).current_limit().unit(), Response::RateLimit::HOUR);
  EXPECT_EQ(Ok("edge", login).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(Ok("edge", login).overall_code(), Response::OVER_LIMIT);
  // One level of the same path has no limit of its own.
  EXPECT_FALSE(Ok("edge", {{{"path", "/login"}}}).statuses(0).has_current_limit());
  // Three entries never match a two-level rule.
  EXPECT_FALSE(Ok("edge", {{{"path", "/login"}, {"remote_address", "10.0.0.9"}, {"x", "y"}}})
                   .statuses(0)
                   .has_current_limit());
  // The client's own one-level limit is separate state.
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.0.0.9"}}}).statuses(0).limit_remaining(), 2u);
}

TEST_F(RlsTest, WildcardValuesGiveEachValueItsOwnState) {
  const auto team = [](const std::string& t) {
    return std::vector<Entries>{{{"service", "orders"}, {"user", t}}};
  };
  Response r = Ok("api", team("team-red"));
  EXPECT_EQ(r.statuses(0).current_limit().name(), "team");
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 2u);
  EXPECT_EQ(Header(r, "RateLimit-Policy"), "\"team\";q=2;w=60");
  EXPECT_EQ(Ok("api", team("team-red")).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(Ok("api", team("team-red")).overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(Ok("api", team("team-blue")).overall_code(), Response::OK);
  // Not matching the prefix: the any-value rule.
  EXPECT_EQ(Ok("api", team("bob")).statuses(0).current_limit().name(), "per_user");
}

TEST_F(RlsTest, ShareThresholdGivesTheValuesOfAWildcardOneState) {
  // envoyproxy/ratelimit's share_threshold: every value the wildcard
  // matches counts against one limit (its cache key holds the pattern).
  absl::StatusOr<Config> config = ParseConfig(R"(
grpc: {listen: 127.0.0.1:0}
envoy:
  - domain: files
    descriptors:
      - key: path
        value: "files/*"
        share_threshold: true
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: "docs/*"
        rate_limit: {unit: minute, requests_per_unit: 1}
)",
                                              "rls.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  StartWith(*config);
  const auto file = [](const std::string& path, const std::string& user) {
    return std::vector<Entries>{{{"path", path}, {"user", user}}};
  };
  EXPECT_EQ(Ok("files", file("files/a.pdf", "ann")).overall_code(), Response::OK);
  EXPECT_EQ(Ok("files", file("files/b.csv", "ann")).overall_code(), Response::OK);
  EXPECT_EQ(Ok("files", file("files/c.txt", "ann")).overall_code(), Response::OVER_LIMIT);
  // The entry after the shared one keeps its value: another user, another state.
  EXPECT_EQ(Ok("files", file("files/a.pdf", "bob")).overall_code(), Response::OK);
  // Without share_threshold each value has its own.
  EXPECT_EQ(Ok("files", {{{"path", "docs/a"}}}).overall_code(), Response::OK);
  EXPECT_EQ(Ok("files", {{{"path", "docs/b"}}}).overall_code(), Response::OK);
  EXPECT_EQ(Ok("files", {{{"path", "docs/a"}}}).overall_code(), Response::OVER_LIMIT);
}

TEST_F(RlsTest, ALongValueIsLimitedLikeAnyOther) {
  // Regression: a descriptor whose key passed 1024 bytes was INVALID_ARGUMENT,
  // which Envoy's default failure mode admits: a long header value escaped
  // every limit. It is now decided under its SHA-256.
  const std::vector<Entries> jwt = {{{"remote_address", std::string(2000, 'x')}}};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Ok("edge", jwt).overall_code(), Response::OK);
  EXPECT_EQ(Ok("edge", jwt).overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(Ok("edge", {{{"remote_address", std::string(2000, 'y')}}}).overall_code(),
            Response::OK);
}

TEST_F(RlsTest, ShadowModeCountsButNeverDenies) {
  const std::vector<Entries> trial = {{{"service", "orders"}, {"user", "user-a"}}};
  const Response first = Ok("api", trial);
  EXPECT_EQ(first.statuses(0).limit_remaining(), 0u);
  for (int i = 0; i < 3; ++i) {
    const Response r = Ok("api", trial);
    EXPECT_EQ(r.overall_code(), Response::OK);
    EXPECT_EQ(r.statuses(0).code(), Response::OK);
    EXPECT_EQ(r.statuses(0).current_limit().name(), "trial");
    EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
    EXPECT_EQ(r.response_headers_to_add_size(), 0);  // a trial is not announced
  }
  const std::string text = metrics_.Render();
  EXPECT_THAT(text, HasSubstr("sluice_decisions_total{policy=\"api.service_orders.user_user-a\","
                              "outcome=\"shadow_denied\"} 3"));
  EXPECT_THAT(text, HasSubstr("sluice_decisions_total{policy=\"api.service_orders.user_user-a\","
                              "outcome=\"allowed\"} 1"));
}

TEST_F(RlsTest, EnvoyLimitHeadersTellTheDescriptorNearestItsLimit) {
  // envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED and
  // LIMIT_REQUEST_HEADERS_ENABLED, beside sluice's own RateLimit fields.
  absl::StatusOr<Config> config = ParseConfig(R"(
grpc: {listen: 127.0.0.1:0}
envoy_limit_headers:
  response: true
  request: {limit: X-Quota, remaining: X-Quota-Left, reset: X-Quota-Reset}
envoy:
  - domain: d
    descriptors:
      - key: a
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: u
        rate_limit: {unlimited: true}
)",
                                              "rls.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  StartWith(*config);
  const auto request_header = [](const Response& r, std::string_view name) {
    for (const auto& h : r.request_headers_to_add()) {
      if (h.key() == name) return h.value();
    }
    return std::string("(absent)");
  };
  // b (2 left of 3 an hour) is nearer its limit than a (4 of 5 a minute).
  Response r = Ok("d", {{{"a", "x"}}, {{"b", "x"}}, {{"u", "x"}}});
  EXPECT_EQ(Header(r, "RateLimit-Limit"), "3");
  EXPECT_EQ(Header(r, "RateLimit-Remaining"), "2");
  EXPECT_EQ(Header(r, "RateLimit-Reset"), "3600");
  EXPECT_EQ(Header(r, "RateLimit-Policy"), "\"d.a\";q=5;w=60, \"d.b\";q=3;w=3600");
  EXPECT_EQ(request_header(r, "X-Quota"), "3");
  EXPECT_EQ(request_header(r, "X-Quota-Left"), "2");
  EXPECT_EQ(request_header(r, "X-Quota-Reset"), "3600");
  EXPECT_EQ(request_header(r, "RateLimit-Limit"), "(absent)");
  // The least left is told, whichever descriptor has it.
  clock_.Advance(Duration::Seconds(20));
  r = Ok("d", {{{"a", "y"}}, {{"a", "y"}}, {{"b", "x"}}});
  EXPECT_EQ(r.statuses(1).limit_remaining(), 3u);
  EXPECT_EQ(r.statuses(2).limit_remaining(), 1u);
  EXPECT_EQ(Header(r, "RateLimit-Remaining"), "1");
  r = Ok("d", {{{"b", "x"}}, {{"a", "z"}}});
  EXPECT_EQ(Header(r, "RateLimit-Limit"), "3");
  EXPECT_EQ(Header(r, "RateLimit-Remaining"), "0");
  // Over its limit, b is told whatever is nearer: 0 left, reset as the
  // window ends (3600 s after it began, 20 s ago).
  r = Ok("d", {{{"a", "w"}}, {{"b", "x"}}});
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(Header(r, "RateLimit-Limit"), "3");
  EXPECT_EQ(Header(r, "RateLimit-Remaining"), "0");
  EXPECT_EQ(Header(r, "RateLimit-Reset"), "3580");
  EXPECT_EQ(request_header(r, "X-Quota-Left"), "0");
  // No limit applies: nothing to tell.
  r = Ok("d", {{{"u", "x"}}, {{"other", "x"}}});
  EXPECT_EQ(Header(r, "RateLimit-Limit"), "(absent)");
  EXPECT_EQ(r.request_headers_to_add_size(), 0);
}

TEST_F(RlsTest, EnvoyShadowModeShadowsEveryRule) {
  // envoyproxy/ratelimit's SHADOW_MODE: decided and counted, never denied;
  // a limit the request gives itself too.
  const std::string rules = R"(
grpc: {listen: 127.0.0.1:0}
envoy:
  - domain: d
    descriptors:
      - key: k
        rate_limit: {unit: minute, requests_per_unit: 1}
)";
  absl::StatusOr<Config> config = ParseConfig("envoy_shadow_mode: true" + rules, "rls.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->envoy->shadow_mode);
  StartWith(*config);
  EXPECT_EQ(Ok("d", {{{"k", "a"}}}).overall_code(), Response::OK);
  for (int i = 0; i < 2; ++i) {
    const Response r = Ok("d", {{{"k", "a"}}});
    EXPECT_EQ(r.overall_code(), Response::OK);
    EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
  }
  EXPECT_THAT(metrics_.Render(),
              HasSubstr("sluice_decisions_total{policy=\"d.k\",outcome=\"shadow_denied\"} 2"));
  rls::RateLimitRequest own = Request("d", {{{"k", "b"}}});
  own.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(1);
  own.mutable_descriptors(0)->mutable_limit()->set_unit(::envoy::type::v3::MINUTE);
  EXPECT_EQ(Ok(own).overall_code(), Response::OK);
  const Response second = Ok(own);
  EXPECT_EQ(second.overall_code(), Response::OK);
  EXPECT_EQ(second.statuses(0).code(), Response::OVER_LIMIT);  // as the peer: only overall is OK
  // Without it, the same rule denies.
  absl::StatusOr<Config> plain = ParseConfig(rules, "rls.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  server_->Swap(*server_->Prepare(*plain));
  EXPECT_EQ(Ok("d", {{{"k", "c"}}}).overall_code(), Response::OK);
  EXPECT_EQ(Ok("d", {{{"k", "c"}}}).overall_code(), Response::OVER_LIMIT);
}

TEST_F(RlsTest, EnvoyMergeDomainsJoinsADomainWrittenTwice) {
  // envoyproxy/ratelimit's MERGE_DOMAIN_CONFIGS.
  absl::StatusOr<Config> config = ParseConfig(R"(
grpc: {listen: 127.0.0.1:0}
envoy_merge_domains: true
envoy:
  - domain: d
    descriptors:
      - key: a
        rate_limit: {unit: minute, requests_per_unit: 1}
  - domain: d
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 1}
)",
                                              "rls.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->envoy->domains.size(), 1u);
  StartWith(*config);
  for (const char* key : {"a", "b"}) {
    EXPECT_EQ(Ok("d", {{{key, "x"}}}).overall_code(), Response::OK) << key;
    EXPECT_EQ(Ok("d", {{{key, "x"}}}).overall_code(), Response::OVER_LIMIT) << key;
  }
}

TEST_F(RlsTest, ReplacesRemovesTheNamedLimitWhenItApplies) {
  const Entries free_plan = {{"plan", "free"}};
  const Entries premium = {{"plan", "premium"}};
  // Alone, the free daily limit applies (1 per day).
  EXPECT_EQ(Ok("api", {free_plan}).overall_code(), Response::OK);
  EXPECT_EQ(Ok("api", {free_plan}).overall_code(), Response::OVER_LIMIT);
  // With the premium descriptor in the same request, it is replaced.
  for (int i = 0; i < 3; ++i) {
    const Response r = Ok("api", {free_plan, premium});
    EXPECT_EQ(r.overall_code(), Response::OK);
    ASSERT_EQ(r.statuses_size(), 2);
    EXPECT_FALSE(r.statuses(0).has_current_limit());
    EXPECT_EQ(r.statuses(1).current_limit().requests_per_unit(), 1000u);
    EXPECT_EQ(r.statuses(1).current_limit().unit(), Response::RateLimit::DAY);
  }
}

TEST_F(RlsTest, RequestHitsAddendCostsThatMany) {
  Response r = Ok("edge", {{{"remote_address", "10.1.1.1"}}}, /*hits=*/2);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 1u);
  r = Ok("edge", {{{"remote_address", "10.1.1.1"}}}, /*hits=*/2);
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);  // 2 more do not fit in the 1 left
  // Over the limit reports 0 left, as envoyproxy/ratelimit does, although
  // the request took nothing and the RateLimit header still says 1.
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
  EXPECT_NE(Header(r, "RateLimit").find(";r=1;"), std::string::npos) << Header(r, "RateLimit");
  EXPECT_EQ(
      Ok("edge", {{{"remote_address", "10.1.1.1"}}}, /*hits=*/0).statuses(0).limit_remaining(), 0u);
}

TEST_F(RlsTest, DescriptorHitsAddendOverridesTheRequests) {
  rls::RateLimitRequest request =
      Request("edge", {{{"remote_address", "10.2.2.2"}}, {{"remote_address", "10.2.2.3"}}}, 2);
  request.mutable_descriptors(0)->mutable_hits_addend()->set_value(3);
  Response r = Ok(request);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);  // 3 taken
  EXPECT_EQ(r.statuses(1).limit_remaining(), 1u);  // the request's 2
  // hits_addend 0 on a descriptor reads without taking.
  request.mutable_descriptors(0)->mutable_hits_addend()->set_value(0);
  request.mutable_descriptors(1)->mutable_hits_addend()->set_value(0);
  r = Ok(request);
  EXPECT_EQ(r.overall_code(), Response::OK);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 1u);
}

TEST_F(RlsTest, PerDescriptorLimitOverrideAppliesItsOwnRate) {
  rls::RateLimitRequest request = Request("edge", {{{"remote_address", "10.3.3.3"}}});
  request.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(1);
  request.mutable_descriptors(0)->mutable_limit()->set_unit(::envoy::type::v3::SECOND);
  Response r = Ok(request);
  EXPECT_EQ(r.overall_code(), Response::OK);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 1u);
  EXPECT_EQ(r.statuses(0).current_limit().unit(), Response::RateLimit::SECOND);
  EXPECT_EQ(Ok(request).overall_code(), Response::OVER_LIMIT);
  clock_.Advance(Duration::Seconds(1));
  EXPECT_EQ(Ok(request).overall_code(), Response::OK);
  // The configured 3/minute of this address was not touched.
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.3.3.3"}}}).statuses(0).limit_remaining(), 2u);
  // As in envoyproxy/ratelimit, an override applies only within a configured domain.
  request.set_domain("nowhere");
  EXPECT_FALSE(Ok(request).statuses(0).has_current_limit());
}

TEST_F(RlsTest, ADenialGivesBackWhatOtherDescriptorsTook) {
  const Response r =
      Ok("edge", {{{"remote_address", "10.4.4.4"}}, {{"remote_address", "50.0.0.5"}}});
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).code(), Response::OK);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 3u);  // given back
  EXPECT_EQ(r.statuses(1).code(), Response::OVER_LIMIT);
  for (uint32_t remaining : {2u, 1u, 0u}) {
    EXPECT_EQ(Ok("edge", {{{"remote_address", "10.4.4.4"}}}).statuses(0).limit_remaining(),
              remaining);
  }
}

TEST_F(RlsTest, SluiceAlgorithmsAndWindowsThroughTheSameApi) {
  // token_bucket 2/s burst 4: four at once, then one per half second.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Ok("ext", {{{"client", "c1"}}}).overall_code(), Response::OK) << i;
  }
  Response r = Ok("ext", {{{"client", "c1"}}});
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).duration_until_reset().nanos(), 500'000'000);  // the next token
  EXPECT_EQ(Header(r, "RateLimit-Policy"), "\"ext.client\";q=4;w=1");
  clock_.Advance(Duration::Millis(500));
  EXPECT_EQ(Ok("ext", {{{"client", "c1"}}}).overall_code(), Response::OK);
  // A 10 s window, which no Envoy unit names.
  r = Ok("ext", {{{"tenant", "t1"}}});
  EXPECT_EQ(r.statuses(0).current_limit().unit(), Response::RateLimit::UNKNOWN);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 3u);
  EXPECT_EQ(Header(r, "RateLimit-Policy"), "\"tenant_window\";q=3;w=10");
}

TEST_F(RlsTest, ADescriptorWithoutEntriesIsNotLimited) {
  // As envoyproxy/ratelimit: it reaches no rule, so it is OK without a limit,
  // and the request's other descriptors are decided as usual.
  const Response r = Ok("edge", {{}, {{{"remote_address", "10.9.9.9"}}}});
  EXPECT_EQ(r.overall_code(), Response::OK);
  ASSERT_EQ(r.statuses_size(), 2);
  EXPECT_EQ(r.statuses(0).code(), Response::OK);
  EXPECT_FALSE(r.statuses(0).has_current_limit());
  EXPECT_TRUE(r.statuses(1).has_current_limit());
  // With a limit override, that limit applies, as there.
  rls::RateLimitRequest request = Request("edge", {{}});
  request.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(1);
  request.mutable_descriptors(0)->mutable_limit()->set_unit(::envoy::type::v3::RateLimitUnit::HOUR);
  EXPECT_EQ(Ok(request).overall_code(), Response::OK);
  EXPECT_EQ(Ok(request).overall_code(), Response::OVER_LIMIT);
}

TEST_F(RlsTest, MalformedRequestsAreInvalidArgument) {
  std::vector<std::pair<rls::RateLimitRequest, std::string>> cases;
  cases.push_back({Request("", {{{"k", "v"}}}), "domain must not be empty"});
  cases.push_back({Request("edge", {}), "descriptors must not be empty"});
  cases.push_back({Request("edge", {{{"k", "v"}}, {{"", "v"}}}),
                   "descriptors[1].entries[0]: key must not be empty"});
  cases.push_back({Request("edge", {{{"remote_address", std::string(70'000, 'x')}}}),
                   "descriptors[0]: the domain and entries make a key of"});
  rls::RateLimitRequest huge = Request("edge", {{{"remote_address", "10.0.0.1"}}});
  huge.mutable_descriptors(0)->mutable_hits_addend()->set_value(uint64_t{1} << 63);
  cases.push_back({huge, "descriptors[0].hits_addend: 9223372036854775808 is more than"});
  rls::RateLimitRequest bad_unit = Request("edge", {{{"remote_address", "10.0.0.1"}}});
  bad_unit.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(5);
  bad_unit.mutable_descriptors(0)->mutable_limit()->set_unit(
      static_cast<::envoy::type::v3::RateLimitUnit>(99));
  cases.push_back({bad_unit, "descriptors[0].limit.unit: 99 is not a unit"});
  for (const auto& [request, message] : cases) {
    Response response;
    const grpc::Status s = Call(request, response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(s.error_message(), HasSubstr(message));
  }
  EXPECT_THAT(metrics_.Render(),
              HasSubstr("sluice_rls_requests_total{result=\"invalid_argument\"} 6"));
  // The service is still there.
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.0.0.1"}}}).overall_code(), Response::OK);
}

TEST_F(RlsTest, ConcurrentCallsAdmitExactlyTheLimit) {
  constexpr int kThreads = 8;
  constexpr int kCalls = 40;
  std::atomic<int> ok{0}, over{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        Response r;
        if (!Call(Request("inline", {{{"burst_test", "shared"}}}), r).ok()) {
          ++failed;
        } else if (r.overall_code() == Response::OK) {
          ++ok;
        } else {
          ++over;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ok.load(), 100);  // inline: burst_test, 100 per minute
  EXPECT_EQ(over.load(), kThreads * kCalls - 100);
}

TEST_F(RlsTest, AReloadKeepsTheStateOfUnchangedRules) {
  for (int i = 0; i < 3; ++i) Ok("edge", {{{"remote_address", "10.5.5.5"}}});
  Ok("ext", {{{"tenant", "t9"}}});
  // The same file with one rule changed: tenant_window gets 5/10s.
  absl::StatusOr<Config> next = LoadConfigFile(SLUICE_SOURCE_DIR "/tests/envoy/sluice.yaml");
  ASSERT_TRUE(next.ok());
  auto envoy = std::make_shared<EnvoyConfig>(*next->envoy);
  envoy->domains[3].descriptors[1].rate_limit->limit.options.rate.limit = 5;
  next->envoy = envoy;
  absl::StatusOr<std::shared_ptr<const RlsServer::Snapshot>> snapshot = server_->Prepare(*next);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  server_->Swap(*snapshot);
  EXPECT_EQ(Ok("edge", {{{"remote_address", "10.5.5.5"}}}).overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(Ok("ext", {{{"tenant", "t9"}}}).statuses(0).limit_remaining(), 4u);  // fresh state
  // A reload without the domain: its descriptors are unknown from then on.
  next->envoy = std::make_shared<EnvoyConfig>();
  server_->Swap(*server_->Prepare(*next));
  EXPECT_FALSE(Ok("edge", {{{"remote_address", "10.5.5.5"}}}).statuses(0).has_current_limit());
}

// A remote store whose answers come from a thread of its own, as Redis'
// do: the service must finish calls from that thread.
class ThreadedStore final : public RemoteOverMemory {
 public:
  ThreadedStore() : worker_([this] { Run(); }) {}
  ~ThreadedStore() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op, Time now,
                   int64_t cost, Time taken_at, uint64_t slot, BatchCallback done,
                   BatchCallback /*late*/) override {
    std::vector<LimitTable*> t(tables.begin(), tables.end());
    {
      std::lock_guard lock(mu_);
      jobs_.push_back([this, t, key = std::string(key), op, now, cost, taken_at, slot, done] {
        answered_on_ = std::this_thread::get_id();
        Store::DecideBatch(t, key, op, now, cost, taken_at, slot, done);
      });
    }
    cv_.notify_all();
  }
  std::thread::id worker_id() const { return worker_.get_id(); }
  std::atomic<std::thread::id> answered_on_;
  // While held, decisions wait (Hold), until Release.
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  size_t waiting() {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (!held_ && !jobs_.empty()); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  bool held_ = false;
  std::thread worker_;
};

// A fleet domain on `store`: 2 a minute per user.
Config FleetConfig() {
  absl::StatusOr<EnvoyDomain> domain = ParseEnvoyDomain(R"(
domain: fleet
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
)",
                                                        "fleet.yaml", {.shared_store = true});
  EXPECT_TRUE(domain.ok()) << domain.status();
  Config config;
  config.grpc = GrpcConfig{.listen = {"127.0.0.1", 0}};
  auto envoy = std::make_shared<EnvoyConfig>();
  if (domain.ok()) envoy->domains.push_back(*domain);
  config.envoy = envoy;
  return config;
}

TEST_F(RlsTest, DecisionsOfARemoteStoreFinishOnItsThread) {
  ThreadedStore remote;
  StartWith(FleetConfig(), &remote);
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).overall_code(), Response::OVER_LIMIT);
  EXPECT_EQ(remote.answered_on_.load(), remote.worker_id());
}

TEST_F(RlsTest, ACallWaitingOnTheStoreAtShutdownIsAnsweredBeforeTheServerStops) {
  // The server's calls are answered on its completion queues: Wait must not
  // shut them down while an answer is still to come from the store (it
  // would be started on a queue already shut down, which aborts).
  ThreadedStore remote;
  StartWith(FleetConfig(), &remote);
  remote.Hold();
  grpc::Status status;
  std::thread client([&] {
    Response r;
    status = Call(Request("fleet", {{{"user", "u1"}}}), r);
  });
  for (int i = 0; i < 2000 && remote.waiting() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(remote.waiting(), 1u);
  server_->Shutdown(Duration::Millis(20));
  std::atomic<bool> stopped{false};
  std::thread waiter([&] {
    server_->Wait();
    stopped.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(stopped.load());  // past the drain: its call was cancelled, its answer is due
  remote.Release();
  waiter.join();
  client.join();
  EXPECT_TRUE(stopped.load());
  EXPECT_FALSE(status.ok());  // cancelled: the client is told so, or its connection closes
}

// The threads of this process named `name`.
TEST_F(RlsTest, ItsCallsHaveAThreadPerWorkerThread) {
  // server.threads: 0 (this fixture's file), one per CPU this process may run on.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  EXPECT_EQ(ThreadsNamed("sluice-grpc"), CPU_COUNT(&cpus));
  EXPECT_EQ(ThreadsNamed("sluice-grpc-tls"), 0);  // no grpc.tls
  for (int threads : {3, 1}) {
    Config config = FleetConfig();
    config.server.threads = threads;
    StartWith(config);
    EXPECT_EQ(ThreadsNamed("sluice-grpc"), threads);
    EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).overall_code(), Response::OK);
  }
}

TEST_F(RlsTest, OverMutualTlsCallsAreAnsweredAndStrangersRefused) {
  const TestCertificates certs;
  ASSERT_TRUE(certs.ok()) << "the openssl command makes the test certificates";
  Config config = FleetConfig();
  config.grpc->tls = ListenerTls{.cert_file = certs.Path("server", "pem"),
                                 .key_file = certs.Path("server", "key"),
                                 .client_ca_file = certs.Path("ca", "pem")};
  config.server.threads = 3;  // three relay threads, connections given to each in turn
  StartWith(config);
  EXPECT_EQ(ThreadsNamed("sluice-grpc-tls"), 3);
  // Each stub its own connection.
  const auto stub = [&](const std::string& client) {
    const std::string target = "127.0.0.1:" + std::to_string(server_->port());
    grpc::SslCredentialsOptions options{.pem_root_certs = certs.Text("ca", "pem")};
    if (!client.empty()) {
      options.pem_private_key = certs.Text(client, "key");
      options.pem_cert_chain = certs.Text(client, "pem");
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetSslTargetNameOverride("localhost");
    return rls::RateLimitService::NewStub(
        grpc::CreateCustomChannel(target, grpc::SslCredentials(options), args));
  };

  stub_ = stub("client");
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(Ok("fleet", {{{"user", "u1"}}}).overall_code(), Response::OVER_LIMIT);
  // Messages larger than the relay's buffers, both ways, and calls at once.
  const std::string long_user(60'000, 'x');
  EXPECT_EQ(Ok("fleet", {{{"user", long_user}}}).statuses(0).limit_remaining(), 1u);
  std::vector<Entries> many(256, Entries{{"user", "u2"}});
  EXPECT_EQ(Ok("fleet", many).overall_code(), Response::OVER_LIMIT);
  // Calls at once on one connection, and on six (two on each relay thread).
  std::vector<std::thread> callers;
  std::atomic<int> answered{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        Response r;
        answered += Call(Request("fleet", {{{"user", "c" + std::to_string(t)}}}), r).ok();
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(answered.load(), 100);
  std::vector<std::unique_ptr<rls::RateLimitService::Stub>> stubs;
  for (int i = 0; i < 6; ++i) stubs.push_back(stub("client"));
  callers.clear();
  answered = 0;
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        // Six handshakes at once in this process's own gRPC client: about
        // one run in a few hundred under load, one of them gave up (its
        // status "No such file or directory", no TLS error) where clients in
        // another process never did (18,000 handshakes, six at a time): the
        // call waits for the client's next attempt rather than failing.
        context.set_wait_for_ready(true);
        Response r;
        answered += stubs[static_cast<size_t>(t)]
                        ->ShouldRateLimit(
                            &context, Request("fleet", {{{"user", "d" + std::to_string(t)}}}), &r)
                        .ok();
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(answered.load(), 120);

  // No certificate, one of another authority, no TLS at all: refused.
  for (const char* client : {"", "stranger"}) {
    stub_ = stub(client);
    Response r;
    EXPECT_EQ(Call(Request("fleet", {{{"user", "u3"}}}), r).error_code(),
              grpc::StatusCode::UNAVAILABLE)
        << client;
  }
  stub_ = rls::RateLimitService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  Response r;
  EXPECT_EQ(Call(Request("fleet", {{{"user", "u3"}}}), r).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Counted on a relay thread just after its alert went out: the client may
  // have read the alert first.
  const metrics::Counter* failed = metrics_.Get("sluice_tls_handshake_failures_total",
                                                {{"listener", "grpc"}, {"reason", "failed"}});
  for (int i = 0; i < 500 && failed->value() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(failed->value(), 3);
}

TEST_F(RlsTest, GrpcsHealthServiceSaysWhetherItServes) {
  // envoyproxy/ratelimit's names: the whole server ("") and "ratelimit".
  std::atomic<bool> ready{true};
  StartWith(FleetConfig(), nullptr, [&ready] { return ready.load(); });
  namespace health = ::grpc::health::v1;
  const auto stub = health::Health::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  const auto check = [&](const std::string& service, health::HealthCheckResponse& response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    health::HealthCheckRequest request;
    request.set_service(service);
    return stub->Check(&context, request, &response).error_code();
  };
  for (const char* service : {"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"}) {
    health::HealthCheckResponse r;
    EXPECT_EQ(check(service, r), grpc::StatusCode::OK) << service;
    EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVING) << service;
  }
  health::HealthCheckResponse r;
  EXPECT_EQ(check("envoy.service.rate_limit_quota.v3.RateLimitQuotaService", r),
            grpc::StatusCode::NOT_FOUND);  // no rlqs: in this config
  EXPECT_EQ(check("something.Else", r), grpc::StatusCode::NOT_FOUND);
  ready = false;  // sluice serve: draining, or its Redis unreachable
  for (const char* service : {"", "ratelimit"}) {
    EXPECT_EQ(check(service, r), grpc::StatusCode::OK);
    EXPECT_EQ(r.status(), health::HealthCheckResponse::NOT_SERVING) << service;
  }
  ready = true;
  EXPECT_EQ(check("", r), grpc::StatusCode::OK);
  EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVING);
  // Watch: the status at once, then each change (looked at every second).
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  health::HealthCheckRequest request;
  request.set_service("ratelimit");
  auto watch = stub->Watch(&context, request);
  ASSERT_TRUE(watch->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVING);
  ready = false;
  ASSERT_TRUE(watch->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::NOT_SERVING);
  ready = true;
  ASSERT_TRUE(watch->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVING);
  // A name it does not serve: SERVICE_UNKNOWN, the stream kept open.
  grpc::ClientContext unknown_context;
  unknown_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  request.set_service("something.Else");
  auto unknown = stub->Watch(&unknown_context, request);
  ASSERT_TRUE(unknown->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVICE_UNKNOWN);
  // A shutdown: NOT_SERVING at once (not at the next second's look), then
  // the streams end.
  context.TryCancel();
  EXPECT_FALSE(watch->Read(&r));
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::CANCELLED);
  grpc::ClientContext last_context;
  last_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  request.set_service("");
  auto last = stub->Watch(&last_context, request);
  ASSERT_TRUE(last->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::SERVING);
  const auto shutdown_at = std::chrono::steady_clock::now();
  server_->Shutdown(Duration::Millis(100));
  ASSERT_TRUE(last->Read(&r));
  EXPECT_EQ(r.status(), health::HealthCheckResponse::NOT_SERVING);
  EXPECT_LT(std::chrono::steady_clock::now() - shutdown_at, std::chrono::milliseconds(500));
  server_->Wait();
  EXPECT_FALSE(last->Read(&r));
  EXPECT_NE(last->Finish().error_code(), grpc::StatusCode::OK);
  EXPECT_FALSE(unknown->Read(&r));
  EXPECT_NE(unknown->Finish().error_code(), grpc::StatusCode::OK);
}

TEST_F(RlsTest, ShutdownRefusesNewCalls) {
  server_->Shutdown(Duration::Seconds(1));
  server_->Wait();
  Response r;
  EXPECT_FALSE(Call(Request("edge", {{{"remote_address", "10.0.0.1"}}}), r).ok());
}

}  // namespace
}  // namespace sluice::envoy
