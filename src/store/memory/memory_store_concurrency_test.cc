// Run under TSan by scripts/test (label "concurrency").
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/store/memory_store.h"

namespace sluice {
namespace {

constexpr Time kStart = Time::FromUnixMicros(1'700'000'000'000'000);
constexpr int kThreads = 8;

class OneHotKey : public ::testing::TestWithParam<Algorithm> {};

// N threads hammer one key whose limit cannot refill during the test: exactly
// the capacity is admitted, never one more.
TEST_P(OneHotKey, AdmitsExactlyTheCapacity) {
  MemoryStore store;
  const int64_t capacity = 1000;
  auto table = *store.OpenTable(*MakeLimit({.algorithm = GetParam(),
                                            .rate = {capacity, Duration::Days(1)}}));
  std::atomic<int64_t> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        if (table->Decide("hot", kStart, 1)->allowed) admitted.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted.load(), capacity);
}

INSTANTIATE_TEST_SUITE_P(All, OneHotKey,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra,
                                           Algorithm::kLeakyBucket, Algorithm::kFixedWindow,
                                           Algorithm::kSlidingLog, Algorithm::kSlidingWindow),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

// Many threads insert far more keys than the bound while others decide on,
// check and refund a shared set: the bound holds and nothing races.
TEST(MemoryStoreConcurrency, EvictionUnderConcurrentAccess) {
  MemoryStore store({.max_keys = 2000});
  auto table = *store.OpenTable(*MakeLimit({.algorithm = Algorithm::kTokenBucket,
                                            .rate = *ParseRate("5/s")}));
  auto log = *store.OpenTable(*MakeLimit({.algorithm = Algorithm::kSlidingLog,
                                          .rate = *ParseRate("5/s")}));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3000; ++i) {
        const Time now = kStart + Duration::Millis(i);
        const std::string key = (i % 3 == 0) ? "shared" + std::to_string(i % 7)
                                             : "t" + std::to_string(t) + "-" + std::to_string(i);
        ASSERT_TRUE(table->Decide(key, now, 1).ok());
        ASSERT_TRUE(log->Decide(key, now, 1).ok());
        if (i % 5 == 0) {
          ASSERT_TRUE(table->Check(key, now, 1).ok());
          ASSERT_TRUE(log->Refund(key, now, 1).ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The bound may be passed by at most one key per thread racing a reclaim.
  EXPECT_LE(store.stats().keys, 2000 + kThreads);
  EXPECT_GT(store.stats().reclaim_passes, 0);
}

}  // namespace
}  // namespace sluice
