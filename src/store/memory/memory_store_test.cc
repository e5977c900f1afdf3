#include "sluice/store/memory_store.h"

#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "store/memory/compact_key.h"
#include "store/memory/decided_as.h"
#include "store/memory/key_budget.h"
#include "store/memory/packed_window.h"
#include "store/memory/remembered.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

constexpr Time kStart = Time::FromUnixMicros(1'700'000'000'000'000);

LimitConfig Limit(Algorithm algorithm, std::string_view rate, int64_t burst = 0) {
  return *MakeLimit({.algorithm = algorithm, .rate = *ParseRate(rate), .burst = burst});
}

std::shared_ptr<LimitTable> Open(MemoryStore& store, const LimitConfig& config) {
  absl::StatusOr<std::shared_ptr<LimitTable>> table = store.OpenTable(config);
  EXPECT_TRUE(table.ok());
  return *table;
}

TEST(CompactKey, KeepsShortKeysInlineAndLongKeysWhole) {
  const internal::CompactKey short_key("203.0.113.7");
  EXPECT_EQ(short_key.view(), "203.0.113.7");
  EXPECT_EQ(short_key.heap_bytes(), 0u);
  const std::string long_text(200, 'k');
  internal::CompactKey long_key(long_text);
  EXPECT_EQ(long_key.view(), long_text);
  internal::CompactKey moved(std::move(long_key));
  EXPECT_EQ(moved.view(), long_text);
  const internal::CompactKey copy(moved);
  EXPECT_EQ(copy.view(), long_text);
  const std::string with_zero("a\0b", 3);
  EXPECT_EQ(internal::CompactKey(with_zero).view(), with_zero);
}

TEST(CompactKey, EqualsComparesEveryByteOfEveryLength) {
  const internal::KeyEq eq;
  for (size_t n = 0; n <= 40; ++n) {
    std::string text;
    for (size_t i = 0; i < n; ++i) text.push_back(static_cast<char>('a' + i % 26));
    const internal::CompactKey key(text);
    EXPECT_TRUE(key.Equals(text)) << n;
    EXPECT_TRUE(eq(key, std::string_view(text))) << n;
    EXPECT_TRUE(eq(std::string_view(text), key)) << n;
    EXPECT_FALSE(key.Equals(text + "x")) << n;
    if (n > 0) EXPECT_FALSE(key.Equals(std::string_view(text).substr(0, n - 1))) << n;
    // A difference at any one byte, including the ones two loads overlap on.
    for (size_t i = 0; i < n; ++i) {
      std::string other = text;
      other[i] = static_cast<char>(other[i] ^ 0x20);
      EXPECT_FALSE(key.Equals(other)) << n << " " << i;
    }
  }
  EXPECT_TRUE(
      internal::CompactKey(std::string_view("a\0b", 3)).Equals(std::string_view("a\0b", 3)));
  EXPECT_FALSE(
      internal::CompactKey(std::string_view("a\0b", 3)).Equals(std::string_view("a\0c", 3)));
}

// The inline hash (4 to 16 bytes) and the out-of-line one spread keys over
// the store's 64 shards (the top 6 bits) evenly, and a key's every byte
// counts.
TEST(KeyHash, SpreadsKeysOfEveryLengthOverTheShards) {
  const internal::KeyHash hash;
  for (size_t n = 3; n <= 24; ++n) {
    std::vector<int> shards(64);
    constexpr int kKeys = 64'000;
    for (int i = 0; i < kKeys; ++i) {
      // A counter in the key's first and last bytes (and its middle).
      std::string key(n, 'k');
      key[0] = static_cast<char>(i & 0xFF);
      key[n - 1] = static_cast<char>((i >> 8) & 0xFF);
      key[n / 2] = static_cast<char>('k' + ((i >> 16) & 0xFF));
      ++shards[hash(key) >> 58];
    }
    for (int s = 0; s < 64; ++s) {
      EXPECT_GT(shards[s], 800) << "length " << n << " shard " << s;
      EXPECT_LT(shards[s], 1200) << "length " << n << " shard " << s;
    }
  }
  // Equal keys hash equally, stored or looked up; a byte anywhere changes it.
  for (size_t n = 0; n <= 20; ++n) {
    const std::string key(n, 'x');
    EXPECT_EQ(hash(key), hash(internal::CompactKey(key))) << n;
    for (size_t i = 0; i < n; ++i) {
      std::string other = key;
      other[i] = 'y';
      EXPECT_NE(hash(key), hash(other)) << n << " " << i;
    }
  }
}

TEST(MemoryStore, KeysAreIndependent) {
  MemoryStore store;
  auto table = Open(store, Limit(Algorithm::kGcra, "2/min"));
  EXPECT_TRUE(table->Decide("a", kStart, 1)->allowed);
  EXPECT_TRUE(table->Decide("a", kStart, 1)->allowed);
  EXPECT_FALSE(table->Decide("a", kStart, 1)->allowed);
  EXPECT_TRUE(table->Decide("b", kStart, 1)->allowed);
  EXPECT_EQ(store.stats().keys, 2);
}

// Past a few thousand keys every shard moves its keys from lines of their
// own to packed slots (shard_map.h): each key's state goes with it.
TEST(MemoryStore, StatesSurviveTheShardsMoveToPackedSlots) {
  for (const Algorithm algorithm :
       {Algorithm::kGcra, Algorithm::kFixedWindow, Algorithm::kSlidingLog}) {
    MemoryStore store;
    auto table = Open(store, Limit(algorithm, "1/h"));
    constexpr int kKeys = 20'000;  // 312 a shard on average; the move is at 96
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_TRUE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed) << i;
    }
    EXPECT_EQ(store.stats().keys, kKeys);
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_FALSE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed)
          << AlgorithmName(algorithm) << " " << i;
    }
  }
}

// A small shard a second thread decides on moves its keys to lines of
// their own (shard_map.h): each key's state goes with it.
TEST(MemoryStore, StatesSurviveAShardsMoveToLinesWhenThreadsShareIt) {
  for (const Algorithm algorithm : {Algorithm::kGcra, Algorithm::kFixedWindow}) {
    MemoryStore store;
    auto table = Open(store, Limit(algorithm, "1/h"));
    constexpr int kKeys = 1'000;  // 16 a shard on average
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_TRUE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed) << i;
    }
    std::thread other([&] {
      for (int i = 0; i < kKeys; ++i) {
        EXPECT_FALSE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed) << i;
      }
    });
    other.join();
    for (int i = 0; i < kKeys; ++i) {
      ASSERT_FALSE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed) << i;
      ASSERT_TRUE(table->Decide("new" + std::to_string(i), kStart, 1)->allowed) << i;
    }
    EXPECT_EQ(store.stats().keys, 2 * kKeys);
  }
}

TEST(MemoryStore, AcceptsTheMaximumKeyLengthAndRejectsLonger) {
  MemoryStore store;
  auto table = Open(store, Limit(Algorithm::kFixedWindow, "1/min"));
  const std::string longest(kMaxKeyLength, 'x');
  EXPECT_TRUE(table->Decide(longest, kStart, 1)->allowed);
  EXPECT_FALSE(table->Decide(longest, kStart, 1)->allowed);
  const std::string too_long(kMaxKeyLength + 1, 'x');
  absl::StatusOr<Decision> d = table->Decide(too_long, kStart, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("1025 bytes is longer than the maximum of 1024"));
}

TEST(MemoryStore, KeysDifferingOnlyAfterByte15AreDistinct) {
  MemoryStore store;
  auto table = Open(store, Limit(Algorithm::kTokenBucket, "1/h"));
  EXPECT_TRUE(table->Decide("0123456789abcdefA", kStart, 1)->allowed);
  EXPECT_TRUE(table->Decide("0123456789abcdefB", kStart, 1)->allowed);
  EXPECT_FALSE(table->Decide("0123456789abcdefA", kStart, 1)->allowed);
}

TEST(MemoryStore, DeniedAndPeekedKeysCostNoMemory) {
  MemoryStore store;
  auto table = Open(store, Limit(Algorithm::kSlidingLog, "1/min"));
  EXPECT_TRUE(table->Decide("k", kStart, 0)->allowed);
  EXPECT_TRUE(table->Decide("big", kStart, 5)->can_never_pass());
  EXPECT_TRUE(table->Check("other", kStart, 1)->allowed);
  EXPECT_EQ(store.stats().keys, 0);
}

TEST(MemoryStore, CheckTakesNothing) {
  MemoryStore store;
  for (Algorithm a : {Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                      Algorithm::kSlidingLog, Algorithm::kSlidingWindow}) {
    auto table = Open(store, Limit(a, "2/min"));
    EXPECT_TRUE(table->Decide("k", kStart, 1)->allowed);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(table->Check("k", kStart, 1)->allowed);
    EXPECT_TRUE(table->Decide("k", kStart, 1)->allowed) << AlgorithmName(a);
    EXPECT_FALSE(table->Decide("k", kStart, 1)->allowed) << AlgorithmName(a);
  }
}

TEST(MemoryStore, RefundGivesBack) {
  MemoryStore store;
  for (Algorithm a : {Algorithm::kTokenBucket, Algorithm::kGcra, Algorithm::kFixedWindow,
                      Algorithm::kSlidingLog, Algorithm::kSlidingWindow}) {
    auto table = Open(store, Limit(a, "1/min"));
    EXPECT_TRUE(table->Decide("k", kStart, 1)->allowed);
    ASSERT_TRUE(table->Refund("k", kStart, 1, 0).ok());
    EXPECT_TRUE(table->Decide("k", kStart, 1)->allowed) << AlgorithmName(a);
    EXPECT_FALSE(table->Decide("k", kStart, 1)->allowed) << AlgorithmName(a);
  }
}

TEST(MemoryStore, StaysWithinMaxKeysByDroppingFreshKeysFirst) {
  MemoryStore store({.max_keys = 1000});
  auto table = Open(store, Limit(Algorithm::kGcra, "10/s", 1));
  // 1000 keys used at kStart: all fresh again 100 ms later.
  for (int i = 0; i < 1000; ++i)
    ASSERT_TRUE(table->Decide("old" + std::to_string(i), kStart, 1)->allowed);
  EXPECT_EQ(store.stats().keys, 1000);
  const Time later = kStart + Duration::Seconds(1);
  for (int i = 0; i < 500; ++i)
    ASSERT_TRUE(table->Decide("new" + std::to_string(i), later, 1)->allowed);
  const MemoryStoreStats stats = store.stats();
  EXPECT_LE(stats.keys, 1000);
  EXPECT_EQ(stats.forced_evictions, 0);
  EXPECT_GT(stats.fresh_evictions, 0);
}

TEST(MemoryStore, AnActiveAbuserKeepsItsEmptyBucketWhileOthersAreFresh) {
  MemoryStore store({.max_keys = 100});
  auto table = Open(store, Limit(Algorithm::kTokenBucket, "1/h", 1));
  ASSERT_TRUE(table->Decide("abuser", kStart, 1)->allowed);
  ASSERT_FALSE(table->Decide("abuser", kStart, 1)->allowed);
  // A flood of one-off keys on a fast limit: they are fresh one second later.
  auto fast = Open(store, Limit(Algorithm::kTokenBucket, "1/s", 1));
  for (int i = 0; i < 5000; ++i) {
    const Time t = kStart + Duration::Seconds(1 + i / 50);
    ASSERT_TRUE(fast->Decide("flood" + std::to_string(i), t, 1)->allowed);
  }
  EXPECT_LE(store.stats().keys, 100);
  EXPECT_EQ(store.stats().forced_evictions, 0);
  EXPECT_FALSE(table->Decide("abuser", kStart + Duration::Seconds(200), 1)->allowed);
}

TEST(MemoryStore, ForcedEvictionsAreCountedWhenNothingIsFresh) {
  // (kEvict: remembered, the evicted keys would restrict a few of the new
  // ones that share their cells.)
  MemoryStore store({.max_keys = 160, .on_full = OnFull::kEvict});
  auto table = Open(store, Limit(Algorithm::kFixedWindow, "5/day"));
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(table->Decide("k" + std::to_string(i), kStart, 1)->allowed);
  }
  const MemoryStoreStats stats = store.stats();
  EXPECT_LE(stats.keys, 160);
  EXPECT_GE(stats.forced_evictions, 1000 - 160);
  EXPECT_GT(stats.reclaim_passes, 0);
}

// Eviction runs in slices (a few keys per insert), but a forced eviction
// still takes the keys closest to fresh first. The threshold comes from a
// sample and each walk takes the keys under it in the order it meets them,
// so "first" holds by bands: nearly all of the oldest keys go, none of the
// newest half.
TEST(MemoryStore, ForcedEvictionsTakeTheKeysClosestToFreshFirst) {
  // (kEvict: an evicted key then reads as fresh, which shows which went.)
  MemoryStore store({.max_keys = 16'000, .on_full = OnFull::kEvict});
  auto table = Open(store, Limit(Algorithm::kTokenBucket, "1/h", 1));
  // Key i takes its one token at second i: it is fresh again at i + 1 h, so
  // the earlier a key, the closer to fresh. None is fresh during the test.
  auto at = [](int i) { return kStart + Duration::Millis(100 * i); };
  constexpr int kKeys = 20'000;
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(table->Decide("k" + std::to_string(i), at(i), 1)->allowed);
  }
  const MemoryStoreStats stats = store.stats();
  EXPECT_LE(stats.keys, 16'000);
  EXPECT_GE(stats.forced_evictions, kKeys - 16'000);
  EXPECT_EQ(stats.fresh_evictions, 0);
  // Check creates nothing: a kept key is denied, an evicted one is fresh.
  auto evicted = [&](int i) {
    return table->Check("k" + std::to_string(i), at(kKeys), 1)->allowed;
  };
  int oldest_evicted = 0;
  for (int i = 0; i < 1'000; ++i) oldest_evicted += evicted(i);
  int newest_evicted = 0;
  for (int i = kKeys / 2; i < kKeys; ++i) newest_evicted += evicted(i);
  EXPECT_GE(oldest_evicted, 950);
  EXPECT_LE(newest_evicted, 10);
}

// The attack: a client exhausts its key, then sends four times max_keys
// new keys, each taking its one token, so that no key is fresh and its own
// is evicted. Remembered (the default), it stays denied until its true
// reset; forgotten (kEvict), its next request passed; with kDenyNew it is
// never evicted, and the flood's surplus is denied instead.
TEST(MemoryStore, AFloodOfNewKeysNeverResetsAnExhaustedKey) {
  for (const OnFull mode : {OnFull::kRemember, OnFull::kEvict, OnFull::kDenyNew}) {
    SCOPED_TRACE(static_cast<int>(mode));
    MemoryStore store({.max_keys = 1'000, .on_full = mode});
    auto table = Open(store, Limit(Algorithm::kGcra, "1/h", 1));
    ASSERT_TRUE(table->Decide("victim", kStart, 1)->allowed);
    ASSERT_FALSE(table->Decide("victim", kStart, 1)->allowed);
    int flood_denied = 0;
    for (int i = 0; i < 4'000; ++i) {
      flood_denied +=
          !table->Decide("flood-" + std::to_string(i), kStart + Duration::Millis(i), 1)->allowed;
    }
    const Time later = kStart + Duration::Seconds(10);
    absl::StatusOr<Decision> d = table->Decide("victim", later, 1);
    ASSERT_TRUE(d.ok());
    const MemoryStoreStats stats = store.stats();
    EXPECT_LE(stats.keys, 1'000);
    switch (mode) {
      case OnFull::kRemember:
        EXPECT_GE(stats.forced_evictions, 3'000);
        EXPECT_EQ(stats.remembered, stats.forced_evictions);
        EXPECT_FALSE(d->allowed);
        // Denied until its true reset, to the millisecond the table keeps.
        EXPECT_GE(d->retry_after, Duration::Seconds(3590));
        EXPECT_LE(d->retry_after, Duration::Seconds(3590) + Duration::Millis(1));
        EXPECT_FALSE(table->Decide("victim", kStart + Duration::Seconds(3599), 1)->allowed);
        EXPECT_TRUE(
            table->Decide("victim", kStart + Duration::Seconds(3600) + Duration::Millis(1), 1)
                ->allowed);
        // The flood's own keys share cells with the 3,000 remembered ones
        // (in a table this small, a few more than the large table's 0.1%).
        EXPECT_LE(flood_denied, 40);
        EXPECT_EQ(stats.remembered_bytes, 1'000 * kRememberedCellsPerKey * 8);
        break;
      case OnFull::kEvict:
        EXPECT_TRUE(d->allowed);  // the attack works: the reason for the default
        EXPECT_EQ(stats.remembered_bytes, 0);
        break;
      case OnFull::kDenyNew:
        EXPECT_FALSE(d->allowed);
        EXPECT_EQ(stats.forced_evictions, 0);
        EXPECT_GE(flood_denied, 3'000);
        EXPECT_EQ(stats.denied_new, flood_denied);
        break;
    }
  }
}

// Among keys equally close to fresh, remembering evicts first those whose
// remembered form loses nothing (a bucket's state comes back whole; a log's
// comes back used up): gcra and sliding_log keys with the same fresh times,
// flooded past max_keys, leave more log keys held.
TEST(MemoryStore, RememberingEvictsTheKeysItBringsBackWholeFirst) {
  auto held = [](LimitTable& t) {
    auto* r = dynamic_cast<internal::ReclaimableTable*>(&t);
    r->Freeze();
    const int64_t n = r->KeysWhileFrozen();
    r->Thaw();
    return n;
  };
  for (const OnFull mode : {OnFull::kRemember, OnFull::kEvict}) {
    SCOPED_TRACE(static_cast<int>(mode));
    MemoryStore store({.max_keys = 4'000, .on_full = mode});
    auto bucket = Open(store, Limit(Algorithm::kGcra, "1/h", 1));
    auto log = Open(store, Limit(Algorithm::kSlidingLog, "1/h"));
    for (int i = 0; i < 3'000; ++i) {
      const Time at = kStart + Duration::Millis(i);
      ASSERT_TRUE(bucket->Decide("b" + std::to_string(i), at, 1).ok());
      ASSERT_TRUE(log->Decide("l" + std::to_string(i), at, 1).ok());
    }
    const int64_t buckets = held(*bucket), logs = held(*log);
    EXPECT_LE(buckets + logs, 4'000);
    if (mode == OnFull::kRemember) {
      EXPECT_GT(logs, buckets + 500) << "buckets " << buckets << ", logs " << logs;
    } else {
      EXPECT_LT(std::abs(logs - buckets), 500) << "buckets " << buckets << ", logs " << logs;
    }
  }
}

// Every algorithm's remembered state is at least as restrictive as the one
// it replaces, for any cost at any later time, and fresh no earlier.
template <typename Config>
void ExpectNeverFresher(const LimitConfig& limit, uint64_t seed) {
  const Config& config = std::get<Config>(limit);
  std::mt19937_64 rng(seed);
  StateOf_t<Config> fresh{};
  const int64_t capacity = CheckInPlace(config, fresh, kStart, 0).limit;
  for (int trial = 0; trial < 200; ++trial) {
    StateOf_t<Config> state{};
    Time now = kStart + Duration::Micros(static_cast<int64_t>(rng() % 10'000'000));
    const int steps = static_cast<int>(rng() % 8);
    for (int i = 0; i < steps; ++i) {
      now = now + Duration::Micros(static_cast<int64_t>(rng() % 300'000));
      const int64_t cost = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(capacity));
      if (rng() % 4 == 0) {
        ChargeInPlace(config, state, now, cost * 2);
      } else {
        DecideInPlace(config, state, now, cost);
      }
    }
    const Time fresh_at = FreshAt(config, state);
    if (fresh_at <= now) continue;
    // The table keeps milliseconds, rounded up.
    const Time until = Time::FromUnixMicros((fresh_at.unix_micros() + 999) / 1000 * 1000);
    StateOf_t<Config> recalled = internal::StateUntil(config, until, now);
    EXPECT_GE(FreshAt(config, recalled), fresh_at);
    for (int probe = 0; probe < 20; ++probe) {
      const Time at = now + Duration::Micros(static_cast<int64_t>(
                                rng() % static_cast<uint64_t>((until - now).micros() +
                                                              2 * Duration::Seconds(1).micros())));
      const int64_t cost = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(capacity));
      StateOf_t<Config> a = internal::StateUntil(config, until, now);
      if (CheckInPlace(config, a, at, cost).allowed) {
        ASSERT_TRUE(CheckInPlace(config, state, at, cost).allowed)
            << "trial " << trial << " cost " << cost << " at +" << (at - now).micros() << "us";
      }
    }
  }
}

TEST(MemoryStore, ARememberedStateIsNeverFresherThanTheOneItReplaces) {
  ExpectNeverFresher<GcraConfig>(Limit(Algorithm::kGcra, "10/s", 5), 1);
  ExpectNeverFresher<TokenBucketConfig>(Limit(Algorithm::kTokenBucket, "10/s", 5), 2);
  ExpectNeverFresher<FixedWindowConfig>(Limit(Algorithm::kFixedWindow, "10/s"), 3);
  ExpectNeverFresher<SlidingWindowConfig>(Limit(Algorithm::kSlidingWindow, "10/s"), 4);
  ExpectNeverFresher<SlidingLogConfig>(Limit(Algorithm::kSlidingLog, "10/s"), 5);
  ExpectNeverFresher<LeakyPoliceConfig>(Limit(Algorithm::kLeakyBucket, "10/s", 5), 6);
}

TEST(RememberedKeys, NeverFresherAndFewFalseRestrictions) {
  // 300,000 keys remembered in the table of a store of max_keys 100,000
  // (the attack's numbers: a flood of 400,000 new keys): each is recalled
  // at least as late as it was remembered; of 100,000 keys never
  // remembered, under 0.1% read as restricted.
  internal::RememberedKeys table(100'000 * kRememberedCellsPerKey);
  std::mt19937_64 rng(42);
  std::vector<std::pair<uint64_t, Time>> kept;
  for (int i = 0; i < 300'000; ++i) {
    const uint64_t h = rng();
    const Time until = kStart + Duration::Seconds(60 + static_cast<int64_t>(rng() % 3600));
    table.Remember(h, until, kStart);
    kept.emplace_back(h, until);
  }
  for (const auto& [h, until] : kept) {
    const std::optional<Time> got = table.Recall(h, kStart);
    ASSERT_TRUE(got.has_value());
    ASSERT_GE(*got, until);
  }
  int restricted = 0;
  for (int i = 0; i < 100'000; ++i) restricted += table.Recall(rng(), kStart).has_value();
  EXPECT_LT(restricted, 100) << restricted << " of 100,000 innocent keys restricted";
  // Once every remembered time has passed, nothing applies.
  EXPECT_FALSE(table.Recall(kept[0].first, kStart + Duration::Hours(2)).has_value());
}

// The sliding log answers its certain denials from the log's summary,
// without its lock (log_cell.h). Every answer is still the one the
// algorithm gives on its own state: mixed costs, refunds, a clock that
// steps back (a denial's time is kept, so a later request behind it is
// decided as of that time, as Decide would).
TEST(MemoryStore, SlidingLogAnswersAsTheAlgorithmDoesWithDenialsOffItsLock) {
  const LimitConfig config = Limit(Algorithm::kSlidingLog, "5/s");
  const SlidingLogConfig& log = std::get<SlidingLogConfig>(config);
  MemoryStore store;
  auto table = Open(store, config);
  SlidingLogState reference;
  std::mt19937_64 rng(7);
  int64_t now_us = kStart.unix_micros();
  std::vector<std::pair<int64_t, int64_t>> taken;  // (time, cost) admitted
  int denials = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t step = static_cast<int64_t>(rng() % 100);
    if (step < 8) {
      now_us -= static_cast<int64_t>(rng() % 400'000);  // the clock steps back
    } else {
      now_us += static_cast<int64_t>(rng() % 120'000);
    }
    const Time now = Time::FromUnixMicros(now_us);
    if (step >= 95 && !taken.empty()) {  // give one back
      const auto [at, cost] = taken[rng() % taken.size()];
      Refund(log, reference, Time::FromUnixMicros(at), cost);
      ASSERT_TRUE(table->Refund("k", Time::FromUnixMicros(at), cost, 0).ok());
      continue;
    }
    const int64_t cost = step < 60 ? 1 : static_cast<int64_t>(rng() % 4);
    const Decision want = Decide(log, reference, now, cost);
    const absl::StatusOr<Decision> got = table->Decide("k", now, cost);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->allowed, want.allowed) << "request " << i;
    ASSERT_EQ(got->remaining, want.remaining) << "request " << i;
    ASSERT_EQ(got->retry_after, want.retry_after) << "request " << i;
    ASSERT_EQ(got->reset_after, want.reset_after) << "request " << i;
    if (want.allowed && cost > 0) taken.emplace_back(reference.last_time_us(), cost);
    if (!want.allowed) ++denials;
  }
  EXPECT_GT(denials, 5000);
}

// Runs random decides, checks, charges and refunds on one key of a table of
// `config` (rate `rate`, admitting at most `capacity` at once) and on a
// state of the algorithm `reference`, and expects every field of every
// decision alike. `steps_back`: the clock steps back now and then.
template <typename Reference>
void ExpectTableDecidesAs(const LimitConfig& config, const Reference& reference,
                          std::string_view rate, int64_t capacity, uint64_t seed, bool steps_back) {
  StateOf_t<Reference> state;
  MemoryStore store;
  auto table = Open(store, config);
  std::mt19937_64 rng(seed);
  const int64_t gap = ParseRate(rate)->period.micros() / ParseRate(rate)->limit;
  int64_t now_us = kStart.unix_micros();
  std::vector<std::pair<int64_t, int64_t>> taken;  // (time, cost) admitted
  int denials = 0;
  for (int i = 0; i < 5000; ++i) {
    const int64_t step = static_cast<int64_t>(rng() % 100);
    if (step < 5 && steps_back) {
      now_us -= static_cast<int64_t>(rng() % static_cast<uint64_t>(3 * gap + 1));
    } else if (step < 20) {
      // the same instant
    } else if (step < 23) {
      now_us += static_cast<int64_t>(rng() % static_cast<uint64_t>(100 * gap + 1));  // idle
    } else {
      now_us += static_cast<int64_t>(rng() % static_cast<uint64_t>(gap + 1));
    }
    const Time now = Time::FromUnixMicros(now_us);
    const int64_t cost = step % 10 < 6 ? 1 : static_cast<int64_t>(rng() % (capacity + 3));
    // Where a step fails, said only then: a trace built at every step was
    // most of the test's time under the sanitizers.
    const auto where = [&] {
      return ::testing::Message() << "seed " << seed << ", step " << i << ", cost " << cost;
    };
    if (step >= 92 && !taken.empty()) {  // give one back
      const auto [at, given] = taken[rng() % taken.size()];
      RefundInPlace(reference, state, Time::FromUnixMicros(at), given);
      ASSERT_TRUE(table->Refund("k", Time::FromUnixMicros(at), given, 0).ok()) << where();
      continue;
    }
    if (step >= 88) {  // a settled cost over the estimate: debt
      ChargeInPlace(reference, state, now, cost);
      // (An algorithm that takes no charge, the meter, refuses it.)
      ASSERT_EQ(table->Charge("k", now, cost).ok(), kCharges<Reference>) << where();
      continue;
    }
    const bool check = step >= 80;
    const Decision want = check ? CheckInPlace(reference, state, now, cost)
                                : DecideInPlace(reference, state, now, cost);
    const absl::StatusOr<Decision> got =
        check ? table->Check("k", now, cost) : table->Decide("k", now, cost);
    ASSERT_TRUE(got.ok()) << where();
    ASSERT_EQ(got->allowed, want.allowed) << where();
    ASSERT_EQ(got->limit, want.limit) << where();
    ASSERT_EQ(got->remaining, want.remaining) << where();
    ASSERT_EQ(got->reset_after, want.reset_after) << where();
    ASSERT_EQ(got->retry_after, want.retry_after) << where();
    ASSERT_EQ(got->delay, want.delay) << where();
    if (!check && want.allowed && cost > 0) taken.emplace_back(now_us, cost);
    if (!want.allowed) ++denials;
  }
  EXPECT_GT(denials, 500);
}

// A bucket's table (a token bucket or a policing leaky bucket, `Own` its
// config, kept as one word and decided as gcra: decided_as.h) against its
// own functions, or, `kAsDecided`, against what the table decides it as.
template <typename Own, bool kAsDecided = false>
void ExpectBucketTableDecidesAs(Algorithm algorithm, std::string_view rate, int64_t burst,
                                uint64_t seed, bool steps_back) {
  const LimitConfig config = Limit(algorithm, rate, burst);
  const Own& own = std::get<Own>(config);
  if constexpr (kAsDecided) {
    ExpectTableDecidesAs(config, internal::DecidedAs(own), rate, burst, seed, steps_back);
  } else {
    ExpectTableDecidesAs(config, own, rate, burst, seed, steps_back);
  }
}

// On a clock that never goes back: exactly as its own functions, every
// field (a policing leaky bucket's table refuses charges as its own
// functions do: a meter carries no debt).
template <typename Own>
void ExpectABucketTableDecidesAsItsAlgorithm(Algorithm algorithm) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    ExpectBucketTableDecidesAs<Own>(algorithm, "5/s", 5, seed, false);
    ExpectBucketTableDecidesAs<Own>(algorithm, "3/250ms", 7, seed, false);
    ExpectBucketTableDecidesAs<Own>(algorithm, "100/s", 1, seed, false);
    ExpectBucketTableDecidesAs<Own>(algorithm, "7/h", 20, seed, false);
  }
}

// After a clock step back: as gcra decides (as of now, where the two-word
// forms decide as of the last time they saw), never sooner. By hand: one
// of two units taken at t, another asked for at t - 1 s; the own functions
// decide as of t, when one unit is left, and allow; the table decides as
// of t - 1 s, when the bucket, counted back from its zero time (t + 1 s),
// is empty, and says 1 s: later, never earlier.
template <typename Own>
void ExpectABucketTableAfterAStepBackDecidesAsGcra(Algorithm algorithm) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    ExpectBucketTableDecidesAs<Own, true>(algorithm, "5/s", 5, seed, true);
    ExpectBucketTableDecidesAs<Own, true>(algorithm, "3/250ms", 7, seed, true);
  }
  const LimitConfig config = Limit(algorithm, "1/s", 2);
  const Own& own = std::get<Own>(config);
  MemoryStore store;
  auto table = Open(store, config);
  StateOf_t<Own> state;
  const Time t = kStart + Duration::Seconds(10);
  ASSERT_TRUE(table->Decide("k", t, 1)->allowed);
  ASSERT_TRUE(DecideInPlace(own, state, t, 1).allowed);
  const Decision mine = DecideInPlace(own, state, t - Duration::Seconds(1), 1);
  const absl::StatusOr<Decision> got = table->Decide("k", t - Duration::Seconds(1), 1);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(mine.allowed);
  EXPECT_FALSE(got->allowed);
  EXPECT_EQ(got->retry_after, Duration::Seconds(1));
}

TEST(MemoryStore, ATokenBucketDecidesAsItsAlgorithmOnEveryMonotonicTrace) {
  ExpectABucketTableDecidesAsItsAlgorithm<TokenBucketConfig>(Algorithm::kTokenBucket);
}

TEST(MemoryStore, ATokenBucketAfterAClockStepBackDecidesAsGcra) {
  ExpectABucketTableAfterAStepBackDecidesAsGcra<TokenBucketConfig>(Algorithm::kTokenBucket);
}

TEST(MemoryStore, APolicingLeakyBucketDecidesAsItsAlgorithmOnEveryMonotonicTrace) {
  static_assert(!kCharges<internal::PoliceAsGcra>);
  ExpectABucketTableDecidesAsItsAlgorithm<LeakyPoliceConfig>(Algorithm::kLeakyBucket);
}

TEST(MemoryStore, APolicingLeakyBucketAfterAClockStepBackDecidesAsGcra) {
  ExpectABucketTableAfterAStepBackDecidesAsGcra<LeakyPoliceConfig>(Algorithm::kLeakyBucket);
}

// A window of a limit that leaves room keeps its window and counts packed
// in one word: losslessly, so it decides exactly as the algorithm, clock
// steps back, refunds and debt included.
template <typename Config>
void ExpectAPackedWindowDecidesAsItsAlgorithm(Algorithm algorithm,
                                              std::vector<std::string_view> rates) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (const std::string_view rate : rates) {
      for (const bool steps_back : {false, true}) {
        const LimitConfig config = Limit(algorithm, rate);
        const Config& window = std::get<Config>(config);
        ASSERT_GT(internal::PackingOf(window).count_bits, 0) << rate;
        ExpectTableDecidesAs(config, window, rate, window.limit(), seed, steps_back);
      }
    }
  }
}

// A packed table of `config` (1 a minute) keeps the times 2^51 us either
// side of its first decision's (kStart: a time before the epoch too), and
// refuses a time beyond them, saying so, and gives nothing back for one.
void ExpectAPackedTableRefusesTimesOutOfItsWord(const LimitConfig& config, std::string_view name) {
  MemoryStore store;
  auto packed = Open(store, config);
  // Before any decision a refund has nothing to give back, and fixes nothing.
  EXPECT_TRUE(packed->Refund("k", Time::FromUnixMicros(int64_t{1} << 60), 1, 0).ok());
  EXPECT_TRUE(packed->Decide("k", kStart, 1)->allowed);
  const Duration half = Duration::Micros(int64_t{1} << 51);
  const Duration minute = Duration::Seconds(60);
  for (const Time t : {kStart - half + minute, Time::FromUnixMicros(-1), kStart + half - minute}) {
    EXPECT_TRUE(packed->Decide("in-" + std::to_string(t.unix_micros()), t, 1)->allowed)
        << t.unix_micros();
  }
  for (const Time t : {kStart - half - minute, kStart + half}) {
    const absl::StatusOr<Decision> d = packed->Decide("k", t, 1);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(d.status().message(), HasSubstr(name));
    EXPECT_EQ(packed->Check("k", t, 1).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(packed->Charge("k", t, 1).code(), absl::StatusCode::kOutOfRange);
    EXPECT_TRUE(packed->Refund("k", t, 1, 0).ok());
  }
  EXPECT_FALSE(packed->Decide("k", kStart, 1)->allowed);
}

TEST(MemoryStore, APackedFixedWindowDecidesAsItsAlgorithm) {
  ExpectAPackedWindowDecidesAsItsAlgorithm<FixedWindowConfig>(
      Algorithm::kFixedWindow, {"5/s", "40/min", "3/250ms", "1000/h", "1047552/s"});
}

TEST(MemoryStore, AFixedWindowPacksOnlyWhatItsWordHolds) {
  // The count with its debt and the windows of 2^52 us: 30 + 33 bits at
  // 1,047,552 a second; one more takes 31. 1e9 a second is kept unpacked.
  const auto packing = [](std::string_view rate) {
    return internal::PackingOf(std::get<FixedWindowConfig>(Limit(Algorithm::kFixedWindow, rate)));
  };
  EXPECT_EQ(packing("1047552/s").count_bits, 30);
  EXPECT_EQ(packing("1047553/s").count_bits, 0);
  const LimitConfig huge = Limit(Algorithm::kFixedWindow, "1000000000/s");
  EXPECT_EQ(internal::PackingOf(std::get<FixedWindowConfig>(huge)).count_bits, 0);
  MemoryStore store;
  auto unpacked = Open(store, huge);
  EXPECT_TRUE(unpacked->Decide("k", Time::FromUnixMicros(-5), 1)->allowed);
  ExpectAPackedTableRefusesTimesOutOfItsWord(Limit(Algorithm::kFixedWindow, "1/min"),
                                             "fixed_window");
}

TEST(MemoryStore, APackedSlidingWindowDecidesAsItsAlgorithm) {
  ExpectAPackedWindowDecidesAsItsAlgorithm<SlidingWindowConfig>(
      Algorithm::kSlidingWindow, {"5/s", "255/s", "1023/s", "40/min", "3/250ms", "1000/h"});
}

TEST(MemoryStore, ASlidingWindowPacksOnlyWhatItsWordHolds) {
  // The previous count, the current one with its debt and the windows of
  // 2^52 us: 10 + 20 + 33 bits at 1,023 a second, 11 + 21 + 33 at 1,024.
  const auto packing = [](std::string_view rate) {
    return internal::PackingOf(
        std::get<SlidingWindowConfig>(Limit(Algorithm::kSlidingWindow, rate)));
  };
  EXPECT_EQ(packing("1023/s").count_bits, 20);
  EXPECT_EQ(packing("1023/s").prev_bits, 10);
  EXPECT_EQ(packing("1024/s").count_bits, 0);
  EXPECT_GT(packing("8184/min").count_bits, 0);
  EXPECT_EQ(packing("8185/min").count_bits, 0);
  EXPECT_GT(packing("65472/h").count_bits, 0);
  EXPECT_EQ(packing("65473/h").count_bits, 0);
  EXPECT_GT(packing("262143/d").count_bits, 0);
  EXPECT_EQ(packing("262144/d").count_bits, 0);
  MemoryStore store;
  auto unpacked = Open(store, Limit(Algorithm::kSlidingWindow, "2000/s"));
  EXPECT_TRUE(unpacked->Decide("k", Time::FromUnixMicros(-5), 1)->allowed);
  ExpectAPackedTableRefusesTimesOutOfItsWord(Limit(Algorithm::kSlidingWindow, "1/min"),
                                             "sliding_window");
}

// A key evicted from a packed sliding window comes back as restrictive,
// in the first windows after the epoch too (a remembered state's window
// may lie before it).
TEST(MemoryStore, APackedSlidingWindowRemembersAnEvictedKey) {
  for (const Time start : {Time::FromUnixMicros(1'000), kStart}) {
    MemoryStore store({.max_keys = 1'000});
    auto table = Open(store, Limit(Algorithm::kSlidingWindow, "2/h"));
    ASSERT_TRUE(table->Decide("victim", start, 2)->allowed);
    for (int i = 0; i < 4'000; ++i) {
      ASSERT_TRUE(table->Decide("flood-" + std::to_string(i), start + Duration::Millis(i), 1).ok());
    }
    EXPECT_GE(store.stats().remembered, 3'000);
    const absl::StatusOr<Decision> d = table->Decide("victim", start + Duration::Seconds(10), 1);
    ASSERT_TRUE(d.ok());
    EXPECT_FALSE(d->allowed);
  }
}

TEST(MemoryStore, ClosingATableReleasesItsKeys) {
  MemoryStore store({.max_keys = 10});
  {
    auto table = Open(store, Limit(Algorithm::kGcra, "1/s"));
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(table->Decide(std::to_string(i), kStart, 1)->allowed);
    EXPECT_EQ(store.stats().keys, 5);
  }
  EXPECT_EQ(store.stats().keys, 0);
}

}  // namespace
}  // namespace sluice
