#include "metrics/top_keys.h"

#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::metrics {
namespace {

Time At(int64_t seconds) { return Time::FromUnixMicros(seconds * 1'000'000); }

TEST(TopKeysTest, ExactWhileEveryKeyFits) {
  TopKeys top;
  for (int i = 0; i < 5; ++i) top.Add("a", At(100));
  for (int i = 0; i < 3; ++i) top.Add("b", At(101));
  top.Add("c", At(102), 4);
  const std::vector<TopKeys::Entry> got = top.Top(10, At(103));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].key, "a");
  EXPECT_EQ(got[0].count, 5);
  EXPECT_EQ(got[1].key, "c");
  EXPECT_EQ(got[1].count, 4);
  EXPECT_EQ(got[2].key, "b");
  EXPECT_EQ(got[2].count, 3);
  for (const auto& e : got) EXPECT_EQ(e.error, 0);
  EXPECT_EQ(top.Top(1, At(103)).size(), 1u);
}

// An abuser hidden in a flood of distinct keys (one each) is still on top,
// and every reported count brackets the true one.
TEST(TopKeysTest, FindsTheHeavyHitterInAFloodOfNewKeys) {
  TopKeys top;
  std::map<std::string, int64_t> truth;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100'000; ++i) {
    std::string key;
    if (i % 50 == 0) {
      key = "abuser";
    } else if (i % 97 == 0) {
      key = "second";
    } else {
      key = "k" + std::to_string(rng());
    }
    ++truth[key];
    top.Add(key, At(1000 + i / 2000));  // 50 s: one epoch
  }
  const std::vector<TopKeys::Entry> got = top.Top(5, At(1050));
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0].key, "abuser");
  EXPECT_EQ(got[1].key, "second");
  for (const auto& e : got) {
    EXPECT_GE(e.count, truth[e.key]) << e.key;
    EXPECT_LE(e.count - e.error, truth[e.key]) << e.key;
  }
}

TEST(TopKeysTest, BoundsHoldAcrossEpochs) {
  TopKeys top;
  std::map<std::string, int64_t> truth;
  std::mt19937_64 rng(11);
  std::geometric_distribution<int> zipfish(0.1);
  // Four minutes of a skewed stream over a thousand keys.
  for (int i = 0; i < 100'000; ++i) {
    const std::string key = "k" + std::to_string(zipfish(rng) % 1000);
    ++truth[key];
    top.Add(key, At(6000 + i * 240 / 100'000));
  }
  const std::vector<TopKeys::Entry> got = top.Top(20, At(6240));
  ASSERT_EQ(got.size(), 20u);
  for (const auto& e : got) {
    EXPECT_GE(e.count, truth[e.key]) << e.key;
    EXPECT_LE(e.count - e.error, truth[e.key]) << e.key;
  }
  EXPECT_EQ(got[0].key, "k0");
}

// Threads count into shards of their own; Top sums them. Six threads (more
// than there are shards, so some share one), each flooding with keys of its
// own around a key all of them count: that key is on top, counted in full
// where its shards are not full, and every count brackets the true one.
TEST(TopKeysTest, SumsWhatEveryThreadCounted) {
  TopKeys top;
  constexpr int kThreads = 6;
  std::vector<std::map<std::string, int64_t>> truths(kThreads);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&top, &truth = truths[t], t] {
        std::mt19937_64 rng(t);
        for (int i = 0; i < 20'000; ++i) {
          std::string key =
              i % 10 == 0 ? "shared" : "t" + std::to_string(t) + "-" + std::to_string(rng() % 5000);
          ++truth[key];
          top.Add(key, At(3000));
        }
      });
    }
  }
  std::map<std::string, int64_t> truth;
  for (const auto& each : truths) {
    for (const auto& [key, n] : each) truth[key] += n;
  }
  const std::vector<TopKeys::Entry> got = top.Top(50, At(3001));
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0].key, "shared");
  EXPECT_EQ(truth["shared"], kThreads * 2'000);
  for (const auto& e : got) {
    EXPECT_GE(e.count, truth[e.key]) << e.key;
    EXPECT_LE(e.count - e.error, truth[e.key]) << e.key;
  }
  // Few keys, from every thread: nothing is full, every count exact.
  TopKeys few;
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&few, t] {
        for (int i = 0; i < 1000; ++i) few.Add(i % 2 == 0 ? "a" : "b" + std::to_string(t), At(10));
      });
    }
  }
  const std::vector<TopKeys::Entry> exact = few.Top(10, At(10));
  ASSERT_EQ(exact.size(), 1u + kThreads);
  EXPECT_EQ(exact[0].key, "a");
  EXPECT_EQ(exact[0].count, kThreads * 500);
  for (const auto& e : exact) EXPECT_EQ(e.error, 0) << e.key;
}

// A key counted in an epoch and pushed out of it by a flood of others is
// still summed with what it may have had there (that full epoch's least
// count, as error): its count never falls below the true one.
TEST(TopKeysTest, AKeyPushedOutOfAFullEpochKeepsItsBound) {
  TopKeys top;
  top.Add("x", At(60 * 50), 5);
  for (int i = 0; i < 1000; ++i) top.Add("k" + std::to_string(i), At(60 * 50), 10);
  top.Add("x", At(60 * 51), 100);
  const std::vector<TopKeys::Entry> got = top.Top(1, At(60 * 51));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, "x");
  EXPECT_GE(got[0].count, 105);
  EXPECT_LE(got[0].count - got[0].error, 105);
  EXPECT_GT(got[0].error, 0);
}

TEST(TopKeysTest, ForgetsWhatIsOlderThanTheWindow) {
  TopKeys top;
  top.Add("old", At(60 * 100), 50);
  top.Add("new", At(60 * 103), 2);
  EXPECT_EQ(top.Top(10, At(60 * 104)).size(), 2u);
  const std::vector<TopKeys::Entry> later = top.Top(10, At(60 * 105));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].key, "new");
  // The slot of the old epoch is reused, not summed into.
  top.Add("newer", At(60 * 105));
  const std::vector<TopKeys::Entry> now = top.Top(10, At(60 * 105));
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now[0].key, "new");
  EXPECT_TRUE(top.Top(10, At(60 * 200)).empty());
}

}  // namespace
}  // namespace sluice::metrics
