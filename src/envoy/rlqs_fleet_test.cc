// The quota service across two sluice instances on one Redis: the Envoys
// of both share each bucket's limit, never more than it in all (each
// instance assigns only what it claimed in Redis; the claims sum to at most
// the limit).
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "envoy/rls_server.h"
#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "metrics/metrics.h"
#include "redis/redis_server.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/memory_store.h"
#include "sluice/store/redis_store.h"

namespace sluice::envoy {
namespace {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;
using FleetReports = rlqs::RateLimitQuotaUsageReports;
using FleetResponse = rlqs::RateLimitQuotaResponse;

constexpr char kFleetConfig[] = R"(
grpc:
  listen: 127.0.0.1:0
rlqs:
  assignment_ttl: 1s
  domains:
    - domain: web
      buckets:
        - match: {name: api}
          rate: 500/s
)";

struct Instance {
  std::unique_ptr<RedisStore> redis;
  MemoryStore memory;
  metrics::Metrics metrics;
  std::unique_ptr<RlsServer> server;
  std::unique_ptr<rlqs::RateLimitQuotaService::Stub> stub;
};

FleetReports Usage(bool first, int64_t elapsed_ms, uint64_t requests) {
  FleetReports r;
  if (first) r.set_domain("web");
  auto* u = r.add_bucket_quota_usages();
  (*u->mutable_bucket_id()->mutable_bucket())["name"] = "api";
  u->mutable_time_elapsed()->set_nanos(static_cast<int32_t>(elapsed_ms * 1'000'000));
  u->set_num_requests_denied(requests);
  return r;
}

double RateOf(const FleetResponse::BucketAction& a) {
  const auto& s = a.quota_assignment_action().rate_limit_strategy();
  if (!s.has_token_bucket()) return 0;
  const auto& b = s.token_bucket();
  return b.tokens_per_fill().value() /
         (b.fill_interval().seconds() + b.fill_interval().nanos() / 1e9);
}

TEST(RlqsFleetTest, TwoInstancesShareOneLimit) {
  absl::StatusOr<std::unique_ptr<test::RedisServer>> redis_server = test::RedisServer::Start();
  ASSERT_TRUE(redis_server.ok()) << redis_server.status();
  absl::StatusOr<Config> config = ParseConfig(kFleetConfig, "fleet.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  SystemClock clock;
  std::vector<std::unique_ptr<Instance>> instances;
  for (int i = 0; i < 2; ++i) {
    auto in = std::make_unique<Instance>();
    absl::StatusOr<std::unique_ptr<RedisStore>> redis = RedisStore::Connect(
        {.url = "redis://127.0.0.1:" + std::to_string((*redis_server)->port())});
    ASSERT_TRUE(redis.ok()) << redis.status();
    in->redis = *std::move(redis);
    absl::StatusOr<std::unique_ptr<RlsServer>> server = RlsServer::Start(
        *config,
        {.local = &in->memory, .shared = in->redis.get(), .clock = &clock, .metrics = &in->metrics});
    ASSERT_TRUE(server.ok()) << server.status();
    in->server = *std::move(server);
    in->stub = rlqs::RateLimitQuotaService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(in->server->port()), grpc::InsecureChannelCredentials()));
    instances.push_back(std::move(in));
  }
  // Envoy 0 on instance 0 wants 1000 a second; Envoys 1 and 2 on
  // instance 1 want 1000 and 10. The instances split 500 by their wants
  // (500 each, capped at the limit): 250 and 250; instance 1 gives 10 and
  // 240.
  struct Envoy {
    int instance;
    double demand;
  };
  const std::vector<Envoy> envoys = {{0, 1000}, {1, 1000}, {1, 10}};
  std::mutex mu;
  std::vector<double> latest(envoys.size(), 0);
  double worst_sum = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (size_t e = 0; e < envoys.size(); ++e) {
    threads.emplace_back([&, e] {
      grpc::ClientContext context;
      auto stream = instances[envoys[e].instance]->stub->StreamRateLimitQuotas(&context);
      std::thread reader([&] {
        FleetResponse r;
        while (stream->Read(&r)) {
          for (const auto& a : r.bucket_action()) {
            if (!a.has_quota_assignment_action()) continue;
            std::lock_guard lock(mu);
            latest[e] = RateOf(a);
            double sum = 0;
            for (double x : latest) sum += x;
            worst_sum = std::max(worst_sum, sum);
          }
        }
      });
      ASSERT_TRUE(stream->Write(Usage(true, 0, 0)));
      while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!stream->Write(Usage(false, 100, static_cast<uint64_t>(envoys[e].demand / 10)))) break;
      }
      stream->WritesDone();
      reader.join();
      EXPECT_TRUE(stream->Finish().ok());
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  bool converged = false;
  while (!converged && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard lock(mu);
    converged = std::abs(latest[0] - 250) < 3 && std::abs(latest[1] - 240) < 3 &&
                std::abs(latest[2] - 10) < 0.5;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(converged) << latest[0] << ", " << latest[1] << ", " << latest[2];
  // The latest assignments of the three, across both instances, never
  // summed past the limit.
  EXPECT_LE(worst_sum, 500 + 1e-6);
  for (auto& in : instances) {
    for (const QuotaBook::BucketView& v : in->server->QuotaBuckets()) {
      EXPECT_LE(v.committed, 500 + 1e-6);
    }
  }
  // The claims in Redis: one per instance, together within the limit
  // (micro-requests per second).
  redisContext* c = redisConnect("127.0.0.1", (*redis_server)->port());
  ASSERT_NE(c, nullptr);
  auto* r = static_cast<redisReply*>(redisCommand(c, "HVALS %s", "sluice:rlqs:{web\x1fname=api}"));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
  EXPECT_EQ(r->elements, 2u);
  long long claims = 0;
  for (size_t i = 0; i < r->elements; ++i) claims += std::stoll(r->element[i]->str);
  EXPECT_LE(claims, 500'000'000);
  EXPECT_GE(claims, 490'000'000);
  freeReplyObject(r);
  redisFree(c);
}

}  // namespace
}  // namespace sluice::envoy
