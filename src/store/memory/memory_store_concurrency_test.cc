// Run under TSan by scripts/test (label "concurrency").
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/store/memory_store.h"
#include "store/memory/key_budget.h"

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
  auto table = *store.OpenTable(
      *MakeLimit({.algorithm = GetParam(), .rate = {capacity, Duration::Days(1)}}));
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

// The same while other threads insert thousands of keys into the same
// table: every shard grows (a rehash moves the hot key's state) many times
// while the hot key is decided in read sections.
TEST_P(OneHotKey, AdmitsExactlyTheCapacityWhileTheShardsGrow) {
  MemoryStore store;
  const int64_t capacity = 1000;
  auto table = *store.OpenTable(
      *MakeLimit({.algorithm = GetParam(), .rate = {capacity, Duration::Days(1)}}));
  std::atomic<int64_t> admitted{0};
  std::atomic<int> hammering{kThreads / 2};
  std::atomic<int64_t> inserted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads / 2; ++t) {
    threads.emplace_back([&, t] {
      // At least 2,000 keys each, and on until the hot key's threads end
      // (at most 100,000: the store's 1,000,000 keys are never near full).
      for (int i = 0; i < 2'000 || (hammering.load() > 0 && i < 100'000); ++i) {
        ASSERT_TRUE(table->Decide("new-" + std::to_string(t) + "-" + std::to_string(i), kStart, 1)
                        ->allowed);
        inserted.fetch_add(1);
      }
    });
  }
  for (int t = 0; t < kThreads / 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1'000; ++i) {
        if (table->Decide("hot", kStart, 1)->allowed) admitted.fetch_add(1);
      }
      hammering.fetch_sub(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted.load(), capacity);
  EXPECT_EQ(store.stats().keys, inserted.load() + 1);
}

INSTANTIATE_TEST_SUITE_P(All, OneHotKey,
                         ::testing::Values(Algorithm::kTokenBucket, Algorithm::kGcra,
                                           Algorithm::kLeakyBucket, Algorithm::kFixedWindow,
                                           Algorithm::kSlidingLog, Algorithm::kSlidingWindow),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

// Many threads insert far more keys than the bound while others decide on,
// check, refund, charge and renew a shared set: the bound holds and nothing
// races.
TEST(MemoryStoreConcurrency, EvictionUnderConcurrentAccess) {
  MemoryStore store({.max_keys = 2000});
  auto table = *store.OpenTable(
      *MakeLimit({.algorithm = Algorithm::kTokenBucket, .rate = *ParseRate("5/s")}));
  auto log = *store.OpenTable(
      *MakeLimit({.algorithm = Algorithm::kSlidingLog, .rate = *ParseRate("5/s")}));
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
          ASSERT_TRUE(log->Refund(key, now, 1, 0).ok());
        }
        if (i % 5 == 1) {  // every other path through a key's cell
          ASSERT_TRUE(table->Charge(key, now, 2).ok());
          ASSERT_TRUE(table->Renew(key, now, now + Duration::Micros(1), 1, 0).ok());
          ASSERT_TRUE(log->Check(key, now, 1).ok());
          ASSERT_TRUE(log->Renew(key, now, now + Duration::Micros(1), 1, 0).ok());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(store.stats().keys, 2000);
  EXPECT_GT(store.stats().reclaim_passes, 0);
}

// Threads hold and give back named slots of one key, each release sent
// twice: never more than the limit held at once, and every slot free at the
// end. A release given again frees nobody else's slot; counted slots given
// back twice let more in (this test failed in two runs of three with them:
// a race, so the deterministic tests are LimiterTest's and the parity
// tests'; this one is the named paths under TSan).
TEST(MemoryStoreConcurrency, NamedSlotsGivenBackTwiceNeverOvershoot) {
  MemoryStore store;
  constexpr int64_t kLimit = 4;
  auto table = *store.OpenTable(
      *MakeLimit({.algorithm = Algorithm::kConcurrency, .rate = {.limit = kLimit}}));
  std::atomic<int64_t> tick{0}, held{0}, most{0}, admitted{0};
  std::atomic<uint64_t> next_slot{1};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        const Time now = kStart + Duration::Micros(tick.fetch_add(1));
        const uint64_t slot = next_slot.fetch_add(1);
        absl::StatusOr<Decision> d = table->Hold("hot", now, 1, slot);
        ASSERT_TRUE(d.ok()) << d.status();
        if (!d->allowed) continue;
        admitted.fetch_add(1);
        const int64_t h = held.fetch_add(1) + 1;
        int64_t m = most.load();
        while (h > m && !most.compare_exchange_weak(m, h)) {
        }
        for (int y = 0; y < 20; ++y) std::this_thread::yield();  // held a while
        held.fetch_sub(1);
        ASSERT_TRUE(table->Refund("hot", now, 1, slot).ok());
        ASSERT_TRUE(table->Refund("hot", now, 1, slot).ok());  // gives back nothing
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), kLimit);
  EXPECT_GT(admitted.load(), kLimit);
  const Time end = kStart + Duration::Micros(tick.load());
  for (int64_t i = 0; i < kLimit; ++i) {
    EXPECT_TRUE(table->Hold("hot", end, 1, next_slot.fetch_add(1))->allowed);
  }
  EXPECT_FALSE(table->Hold("hot", end, 1, next_slot.fetch_add(1))->allowed);
}

// Regression: max_keys was a soft bound. A thread that found the store full
// while another was reclaiming inserted its key anyway, so a unique-key flood
// from several threads ended above max_keys (500,262 keys held against
// 500,000). Now a slot is reserved before a key goes in.
// The flood attack from several threads: while they flood new keys (so
// that every key is evicted and remembered, some many times over), other
// threads keep asking for exhausted keys: none of them is ever admitted.
TEST(MemoryStoreConcurrency, RememberedKeysStayDeniedUnderAConcurrentFlood) {
  MemoryStore store({.max_keys = 500});
  auto table = *store.OpenTable(
      *MakeLimit({.algorithm = Algorithm::kGcra, .rate = {1, Duration::Hours(1)}, .burst = 1}));
  constexpr int kVictims = 50;
  for (int v = 0; v < kVictims; ++v) {
    ASSERT_TRUE(table->Decide("victim-" + std::to_string(v), kStart, 1)->allowed);
  }
  std::atomic<int64_t> admitted_victims{0};
  std::atomic<bool> flooding{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads / 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3'000; ++i) {
        (void)table->Decide("flood-" + std::to_string(t) + "-" + std::to_string(i), kStart, 1);
      }
    });
  }
  for (int t = 0; t < kThreads / 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; flooding.load(std::memory_order_relaxed); ++i) {
        const std::string key = "victim-" + std::to_string((i * 7 + t) % kVictims);
        if (table->Decide(key, kStart + Duration::Seconds(1), 1)->allowed) {
          admitted_victims.fetch_add(1);
        }
      }
    });
  }
  for (int t = 0; t < kThreads / 2; ++t) threads[t].join();
  flooding.store(false);
  for (int t = kThreads / 2; t < kThreads; ++t) threads[t].join();
  EXPECT_EQ(admitted_victims.load(), 0);
  EXPECT_GT(store.stats().remembered, 0);
  EXPECT_LE(store.stats().keys, 500);
}

TEST(MemoryStoreConcurrency, ConcurrentInsertsNeverPassMaxKeys) {
  constexpr int64_t kMaxKeys = 1000;
  // (kEvict: with hundreds of thousands of keys evicted into a table sized
  // for 1,000, remembered times would restrict some new keys, and every
  // insert here must be admitted.)
  MemoryStore store({.max_keys = kMaxKeys, .on_full = OnFull::kEvict});
  internal::KeyBudget& budget = internal::MemoryStoreTestPeer::Budget(store);
  // Keys on a slow limit stay far from fresh (forced evictions); keys on a
  // fast one are fresh again within the test (fresh evictions).
  auto slow = *store.OpenTable(
      *MakeLimit({.algorithm = Algorithm::kFixedWindow, .rate = *ParseRate("5/day")}));
  auto fast =
      *store.OpenTable(*MakeLimit({.algorithm = Algorithm::kGcra, .rate = *ParseRate("100/s")}));
  // Each thread inserts at least 4,000 keys, and goes on until the counter
  // below has looked 200 times and seen the store over half full once, so
  // that the two overlap however the threads are scheduled (on a loaded
  // machine the counter may take its 200 looks before the inserts start).
  constexpr int kMinSamples = 200;
  std::atomic<int> samples{0};
  std::atomic<bool> seen_half_full{false};
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0;
           i < 4000 || ((samples.load() < kMinSamples || !seen_half_full.load()) && i < 400'000);
           ++i) {
        const Time now = kStart + Duration::Micros(100 * i);
        const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i);
        const bool allowed = ((i & 1) ? fast : slow)->Decide(key, now, 1)->allowed;
        EXPECT_TRUE(allowed);
        if (!allowed) break;  // (and the counter below stops with the others)
      }
      running.fetch_sub(1);
    });
  }
  // Counts the keys really held, at one instant each time (every shard
  // locked), for as long as the inserts go on.
  int64_t most_held = 0;
  while (running.load() > 0) {
    const internal::KeyBudget::HeldKeys count = budget.CountHeldKeys();
    ASSERT_LE(count.held, kMaxKeys) << "after " << samples.load() << " samples";
    ASSERT_LE(count.slots, kMaxKeys);
    ASSERT_GE(count.slots, count.held);
    most_held = std::max(most_held, count.held);
    if (most_held > kMaxKeys / 2) seen_half_full.store(true);
    samples.fetch_add(1);
  }
  for (std::thread& t : threads) t.join();
  const internal::KeyBudget::HeldKeys end = budget.CountHeldKeys();
  EXPECT_LE(end.held, kMaxKeys);
  EXPECT_EQ(store.stats().keys, end.held);
  EXPECT_GT(store.stats().forced_evictions, 0);
  EXPECT_GT(store.stats().fresh_evictions, 0);
  EXPECT_GE(samples.load(), kMinSamples);
  EXPECT_GT(most_held, kMaxKeys / 2);
}

}  // namespace
}  // namespace sluice
