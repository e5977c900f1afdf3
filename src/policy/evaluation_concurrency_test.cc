// policy::Evaluate under concurrent callers, with policies in Redis (run
// under TSan too): the answers of a wave arrive on the store's thread while
// other evaluations start and end on the callers' threads. Every evaluation
// ends exactly once, and all-or-nothing holds across policies: no request is
// admitted beyond the tightest policy, and a denied request keeps nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "metrics/metrics.h"
#include "policy/evaluation.h"
#include "redis/redis_server.h"
#include "sluice/clock.h"
#include "sluice/store/memory_store.h"
#include "sluice/store/redis_store.h"

namespace sluice::policy {
namespace {

TEST(EvaluateConcurrencyTest, RemotePoliciesStayAllOrNothingUnderConcurrentCallers) {
  auto server = test::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<RedisStore>> redis =
      RedisStore::Connect({.url = "redis://127.0.0.1:" + std::to_string((*server)->port()),
                           .timeout = Duration::Seconds(5)});
  ASSERT_TRUE(redis.ok()) << redis.status();
  // Two fleet-wide policies (one wave of two Redis calls per request) and
  // one in process; the narrowest admits 150 in the hour.
  absl::StatusOr<Config> config = ParseConfig(R"yaml(
store: {redis: {url: "redis://127.0.0.1:1"}}
policies:
  - name: wide
    limits: [{algorithm: fixed_window, rate: 1000/h}]
  - name: narrow
    limits: [{algorithm: token_bucket, rate: 150/h}]
  - name: local
    limits: [{algorithm: fixed_window, rate: 400/h, scope: local}]
)yaml",
                                              "test.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  MemoryStore memory;
  metrics::Metrics metrics;
  absl::StatusOr<std::shared_ptr<const PolicySet>> set =
      PolicySet::Create(*config, memory, redis->get(), SystemClock::Default(), nullptr, metrics);
  ASSERT_TRUE(set.ok()) << set.status();
  const std::vector<Applied> applied = {
      {(*set)->Find("wide"), "k"}, {(*set)->Find("narrow"), "k"}, {(*set)->Find("local"), "k"}};
  ASSERT_FALSE(InProcess(applied));

  constexpr int kThreads = 4;
  constexpr int kEach = 100;  // 400 requests: more than the narrow policy admits
  std::atomic<int> ended{0};
  std::atomic<int> allowed{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&] {
      std::atomic<int> in_flight{0};
      for (int i = 0; i < kEach; ++i) {
        while (in_flight.load() >= 8) std::this_thread::yield();
        in_flight.fetch_add(1);
        Evaluate(applied, SystemClock::Default().Now(), [&](Verdict v) {
          if (!v.error.ok()) errors.fetch_add(1);
          if (v.allowed && v.error.ok()) allowed.fetch_add(1);
          ended.fetch_add(1);
          in_flight.fetch_sub(1);
        });
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (in_flight.load() > 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(ended.load(), kThreads * kEach);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(allowed.load(), 150);
  // What the denied requests took was given back: the other policies hold
  // exactly the admitted requests (the refunds are sent without waiting;
  // give them a moment to land).
  const Time now = SystemClock::Default().Now();
  int64_t wide_left = -1;
  for (int i = 0; i < 100 && wide_left != 1000 - 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    absl::StatusOr<std::vector<Decision>> wide =
        (*set)->Find("wide")->limiter().Inspect("k", now, 0);
    ASSERT_TRUE(wide.ok()) << wide.status();
    wide_left = (*wide)[0].remaining;
  }
  EXPECT_EQ(wide_left, 1000 - 150);
  absl::StatusOr<std::vector<Decision>> local =
      (*set)->Find("local")->limiter().Inspect("k", now, 0);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)[0].remaining, 400 - 150);
}

}  // namespace
}  // namespace sluice::policy
