// The quota service (RLQS) over real gRPC streams: three clients play
// Envoys with unequal demand against one bucket of 500/s, report every
// 100 ms, and apply what they are pushed; and streams that report badly.
#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "envoy/rlqs_test_support.h"
#include "envoy/rls_server.h"
#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "metrics/metrics.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/memory_store.h"

namespace sluice::envoy {
namespace {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;
using ::testing::HasSubstr;
using QuotaReports = rlqs::RateLimitQuotaUsageReports;
using QuotaResponse = rlqs::RateLimitQuotaResponse;
using QuotaStream = grpc::ClientReaderWriter<QuotaReports, QuotaResponse>;

constexpr char kQuotaConfig[] = R"(
grpc:
  listen: 127.0.0.1:0
rlqs:
  assignment_ttl: 1s
  max_buckets_per_stream: 5
  domains:
    - domain: web
      buckets:
        - match: {name: api}
          rate: 500/s
      unknown: deny_all
)";

class RlqsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Config> config = ParseConfig(kQuotaConfig, "rlqs.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<RlsServer>> server =
        RlsServer::Start(*config, {.local = &store_, .clock = &clock_, .metrics = &metrics_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = rlqs::RateLimitQuotaService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }

  static QuotaReports Report(const std::string& domain,
                             const std::vector<std::pair<std::string, std::string>>& bucket,
                             int64_t elapsed_ms, uint64_t allowed, uint64_t denied) {
    QuotaReports r;
    r.set_domain(domain);
    auto* u = r.add_bucket_quota_usages();
    for (const auto& [k, v] : bucket) (*u->mutable_bucket_id()->mutable_bucket())[k] = v;
    u->mutable_time_elapsed()->set_seconds(elapsed_ms / 1000);
    u->mutable_time_elapsed()->set_nanos(static_cast<int32_t>(elapsed_ms % 1000 * 1'000'000));
    u->set_num_requests_allowed(allowed);
    u->set_num_requests_denied(denied);
    return r;
  }

  SystemClock clock_;
  MemoryStore store_;
  metrics::Metrics metrics_;
  std::unique_ptr<RlsServer> server_;
  std::unique_ptr<rlqs::RateLimitQuotaService::Stub> stub_;
};

TEST_F(RlqsServiceTest, ThreeEnvoysShareALimitByDemand) {
  // Within a few TTLs (1 s each) the shares are max-min fair.
  const rlqs_test::PlayResult r = rlqs_test::PlayEnvoys(
      {{stub_.get(), 10}, {stub_.get(), 100}, {stub_.get(), 1000}},
      [](const std::vector<double>& rate) {
        return std::abs(rate[0] - 10) < 0.5 && std::abs(rate[1] - 100) < 1 &&
               std::abs(rate[2] - 390) < 4;
      },
      std::chrono::seconds(8),
      [&] {
        // Per rule: three Envoys.
        const std::string metrics = metrics_.Render();
        EXPECT_THAT(metrics, HasSubstr("sluice_rlqs_envoys{domain=\"web\",rule=\"name=api\"} 3"));
        EXPECT_THAT(metrics, HasSubstr("sluice_rlqs_streams 3"));
      });
  EXPECT_TRUE(r.converged) << r.latest[0] << ", " << r.latest[1] << ", " << r.latest[2];
  // The latest assignments of the three never summed past the limit.
  EXPECT_LE(r.worst_sum, 500 + 1e-6);
  // The book's own account: never more in force than the limit.
  for (const QuotaBook::BucketView& v : server_->QuotaBuckets()) EXPECT_LE(v.committed, 500 + 1e-6);
}

// A reload's new limit applies to the buckets the service holds.
TEST_F(RlqsServiceTest, AReloadChangesTheLimit) {
  auto near = [](double want) {
    return [want](const std::vector<double>& rate) { return std::abs(rate[0] - want) < 1; };
  };
  rlqs_test::PlayResult r =
      rlqs_test::PlayEnvoys({{stub_.get(), 1000}}, near(500), std::chrono::seconds(5), [&] {
        std::string text = kQuotaConfig;
        text.replace(text.find("rate: 500/s"), 11, "rate: 200/s");
        absl::StatusOr<Config> config = ParseConfig(text, "rlqs.yaml");
        ASSERT_TRUE(config.ok()) << config.status();
        auto next = server_->Prepare(*config);
        ASSERT_TRUE(next.ok()) << next.status();
        server_->Swap(*next);
      });
  EXPECT_TRUE(r.converged) << r.latest[0];
  r = rlqs_test::PlayEnvoys({{stub_.get(), 1000}}, near(200), std::chrono::seconds(5));
  EXPECT_TRUE(r.converged) << r.latest[0];
}

TEST_F(RlqsServiceTest, BadStreamsAreEndedWithTheReason) {
  auto run = [&](const std::vector<QuotaReports>& reports) {
    grpc::ClientContext context;
    std::unique_ptr<QuotaStream> stream = stub_->StreamRateLimitQuotas(&context);
    for (const QuotaReports& r : reports) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
    QuotaResponse ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  };
  grpc::Status s = run({Report("", {{"name", "api"}}, 0, 0, 0)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("must name its domain"));
  s = run({Report("web", {{"name", "api"}}, 0, 0, 0), Report("mail", {{"name", "api"}}, 0, 0, 0)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("domain cannot change"));
  s = run({Report("nobody", {{"name", "api"}}, 0, 0, 0)});
  EXPECT_THAT(s.error_message(), HasSubstr("unknown domain"));
  s = run({Report("web", {}, 0, 0, 0)});
  EXPECT_THAT(s.error_message(), HasSubstr("no entries"));
  s = run({Report("web", {{"name", "api"}}, 7'200'000, 0, 0)});
  EXPECT_THAT(s.error_message(), HasSubstr("time_elapsed"));
  std::vector<QuotaReports> flood;
  for (int i = 0; i < 6; ++i) {
    flood.push_back(Report(i == 0 ? "web" : "", {{"name", "b" + std::to_string(i)}}, 0, 0, 0));
  }
  s = run(flood);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("at most 5 buckets"));
  // A good stream that closes its side ends OK.
  s = run({Report("web", {{"name", "api"}}, 0, 0, 0)});
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace sluice::envoy
