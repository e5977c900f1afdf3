// The Redis store under concurrent callers (run under TSan too): every call
// is answered exactly once, never more than the limit is admitted, and a
// Redis that dies and comes back under load neither loses nor repeats an
// answer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "redis/redis_server.h"
#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"
#include "sluice/store/redis_store.h"

namespace sluice {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Counts {
  std::atomic<int> answered{0};
  std::atomic<int> allowed{0};
  std::atomic<int> store_errors{0};
  std::atomic<int> errors{0};
};

// Each thread keeps `depth` calls in flight until it has made `calls`. In
// turns, each thread asks in turns of its own, ended when it has `depth`
// calls out.
void Hammer(Limiter& limiter, int threads, int calls, int depth, Counts& counts,
            bool in_turns = false) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::atomic<int> in_flight{0};
      LoopTurnQueue turn;
      for (int i = 0; i < calls; ++i) {
        while (in_flight.load() >= depth) {
          turn.End();
          std::this_thread::yield();
        }
        in_flight.fetch_add(1);
        std::optional<InTurn> asked_in_turn;
        if (in_turns) asked_in_turn.emplace(turn);
        limiter.AcquireAsync(t % 2 == 0 ? "hot" : "hot2", SystemClock::Default().Now(), 1,
                             [&](absl::StatusOr<PolicyDecision> d) {
                               if (!d.ok()) {
                                 counts.errors.fetch_add(1);
                               } else {
                                 if (d->allowed && !d->store_error) counts.allowed.fetch_add(1);
                                 if (d->store_error) counts.store_errors.fetch_add(1);
                               }
                               counts.answered.fetch_add(1);
                               in_flight.fetch_sub(1);
                             });
      }
      turn.End();
      const auto until = SteadyClock::now() + std::chrono::seconds(20);
      while (in_flight.load() > 0 && SteadyClock::now() < until) std::this_thread::yield();
    });
  }
  for (std::thread& t : pool) t.join();
}

// Also with each thread asking in turns of its own loop (InTurn).
TEST(RedisStoreConcurrencyTest, ExactUnderConcurrentCallers) {
  for (bool in_turns : {false, true}) {
    SCOPED_TRACE(in_turns ? "in turns" : "one at a time");
    auto server = test::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    auto redis =
        RedisStore::Connect({.url = "redis://127.0.0.1:" + std::to_string((*server)->port()),
                             .timeout = Duration::Seconds(2)});
    ASSERT_TRUE(redis.ok()) << redis.status();
    MemoryStore memory;
    auto limiter = Limiter::Create(
        memory, {.name = "c",
                 .limits = {{.algorithm = Algorithm::kSlidingLog, .rate = *ParseRate("150/1h")}},
                 .stores = {redis->get()}});
    ASSERT_TRUE(limiter.ok()) << limiter.status();
    Counts counts;
    Hammer(**limiter, 4, 300, 16, counts, in_turns);
    EXPECT_EQ(counts.answered.load(), 1200);
    EXPECT_EQ(counts.errors.load(), 0);
    EXPECT_EQ(counts.store_errors.load(), 0);
    EXPECT_EQ(counts.allowed.load(), 300);  // 150 on each of the two keys
  }
}

// Two instances sharing one Redis while the fleet switches its window limits
// to the integer form (store.redis.window_state): one writes text, the other
// integers, both over the same keys at once, each with two threads. Each
// reads what the other writes: exactly the limit is admitted, for a fixed
// and a sliding window. (1 h windows: the test takes about a second.)
TEST(RedisStoreConcurrencyTest, ExactWhileInstancesWriteAWindowInBothForms) {
  auto server = test::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = "redis://127.0.0.1:" + std::to_string((*server)->port());
  auto text = RedisStore::Connect(
      {.url = url, .timeout = Duration::Seconds(2), .window_state = WindowState::kText});
  auto integer = RedisStore::Connect(
      {.url = url, .timeout = Duration::Seconds(2), .window_state = WindowState::kInteger});
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_TRUE(integer.ok()) << integer.status();
  for (const Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    MemoryStore memory;
    const std::string name(AlgorithmName(algorithm));
    const LimiterOptions policy = {
        .name = name, .limits = {{.algorithm = algorithm, .rate = *ParseRate("150/1h")}}};
    LimiterOptions on_text = policy, on_integer = policy;
    on_text.stores = {text->get()};
    on_integer.stores = {integer->get()};
    auto a = Limiter::Create(memory, on_text);
    auto b = Limiter::Create(memory, on_integer);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    Counts counts;
    std::thread other([&] { Hammer(**b, 2, 300, 16, counts); });
    Hammer(**a, 2, 300, 16, counts);
    other.join();
    EXPECT_EQ(counts.answered.load(), 1200);
    EXPECT_EQ(counts.errors.load(), 0);
    EXPECT_EQ(counts.store_errors.load(), 0);
    EXPECT_EQ(counts.allowed.load(), 300);  // 150 on each of the two keys
  }
}

// Leased limits (docs/distributed.md, "Leased limits"): two stores (two
// instances) with four threads each decide from their slices, take the next
// ones and give back the unused at the end, never more than the limit: a
// fixed_window, and a gcra whose burst is the limit (200 an hour: in about
// a second no more than the burst). (A window boundary inside the run would
// admit twice the limit: the test is 1 h windows and takes about a second.)
TEST(RedisStoreConcurrencyTest, LeasedSlicesUnderConcurrentCallers) {
  auto server = test::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const int64_t now_us = SystemClock::Default().Now().unix_micros();
  const int64_t hour_us = int64_t{3600} * 1'000'000;
  if (hour_us - now_us % hour_us < 20'000'000) {
    std::this_thread::sleep_for(std::chrono::microseconds(hour_us - now_us % hour_us + 100'000));
  }
  for (const Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kGcra}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    MemoryStore memory;
    std::vector<std::unique_ptr<RedisStore>> stores;
    std::vector<std::unique_ptr<Limiter>> limiters;
    for (int i = 0; i < 2; ++i) {
      auto redis =
          RedisStore::Connect({.url = "redis://127.0.0.1:" + std::to_string((*server)->port()),
                               .timeout = Duration::Seconds(5)});
      ASSERT_TRUE(redis.ok()) << redis.status();
      stores.push_back(*std::move(redis));
      auto limiter = Limiter::Create(
          memory, {.name = "leased",
                   .limits = {{.algorithm = algorithm, .rate = *ParseRate("200/1h")}},
                   .stores = {stores.back().get()},
                   .leases = {LeaseOptions{.ttl = Duration::Millis(20)}}});
      ASSERT_TRUE(limiter.ok()) << limiter.status();
      limiters.push_back(*std::move(limiter));
    }
    Counts counts;
    std::thread other([&] { Hammer(*limiters[1], 4, 300, 16, counts); });
    Hammer(*limiters[0], 4, 300, 16, counts);
    other.join();
    EXPECT_EQ(counts.answered.load(), 2400);
    EXPECT_EQ(counts.errors.load(), 0);
    EXPECT_EQ(counts.store_errors.load(), 0);
    // At most 200 on each of the two keys; the slices of both stores were
    // spent while demand lasted (6x the limit).
    EXPECT_LE(counts.allowed.load(), 400);
    EXPECT_GE(counts.allowed.load(), 400 - 2 * 2 * 25);  // at most a slice per store and key lost
    limiters.clear();
    stores.clear();  // each gives back what its (window) slices have left
  }
}

TEST(RedisStoreConcurrencyTest, EveryCallAnsweredOnceWhileRedisDiesAndReturns) {
  auto server = test::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto redis = RedisStore::Connect({.url = "redis://127.0.0.1:" + std::to_string((*server)->port()),
                                    .timeout = Duration::Millis(200)});
  ASSERT_TRUE(redis.ok()) << redis.status();
  MemoryStore memory;
  auto limiter = Limiter::Create(
      memory, {.name = "f",
               .limits = {{.algorithm = Algorithm::kGcra, .rate = *ParseRate("1000000/1s")}},
               .stores = {redis->get()},
               .on_store_error = OnStoreError::kLocal});
  ASSERT_TRUE(limiter.ok()) << limiter.status();
  Counts counts;
  // The load runs on its own threads; the server is killed and restarted
  // from this one (RedisServer's child dies with the thread that started it).
  std::thread load([&] { Hammer(**limiter, 3, 2000, 8, counts); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE((*server)->Kill().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_TRUE((*server)->Restart().ok());
  load.join();
  EXPECT_EQ(counts.answered.load(), 6000);
  EXPECT_EQ(counts.errors.load(), 0);
  EXPECT_EQ(counts.allowed.load() + counts.store_errors.load(), 6000);
  // Back to Redis after the restart.
  const auto start = SteadyClock::now();
  while (!(*redis)->Health().up && SteadyClock::now() - start < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  absl::StatusOr<PolicyDecision> d = (*limiter)->Acquire("after");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->store_error);
}

}  // namespace
}  // namespace sluice
