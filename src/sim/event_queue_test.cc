#include "sim/event_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace sluice::sim {
namespace {

struct Event {
  int64_t time_us;
  uint64_t seq;
};

TEST(EventQueue, TakesEventsByTimeThenByTheOrderTheyCameIn) {
  EventQueue<Event> q;
  q.Push({.time_us = 5, .seq = 0});
  q.Push({.time_us = 1'000'000, .seq = 1});  // far ahead
  q.Push({.time_us = 5, .seq = 2});
  q.Push({.time_us = 300, .seq = 3});  // in a later bucket
  q.Push({.time_us = 0, .seq = 4});
  std::vector<uint64_t> order;
  while (!q.empty()) order.push_back(q.Pop().seq);
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 0, 2, 3, 1}));
}

// A bucket is sorted one of two ways by how many events it holds (an
// insertion sort of a few, a counting sort of more): every size on either
// side of the switch, its times shuffled within the bucket, many of them
// equal, comes out by time and then by the order the events came in.
TEST(EventQueue, SortsABucketOfAnySizeStably) {
  std::mt19937_64 rng(5);
  for (size_t n = 1; n <= 40; ++n) {
    for (int round = 0; round < 20; ++round) {
      EventQueue<Event> q;
      // One event taken first: the wheel then starts at time 0, and the
      // bucket's events go to it in the order they come, not sorted.
      q.Push({.time_us = 0, .seq = 0});
      q.Pop();
      std::vector<std::pair<int64_t, uint64_t>> want;
      const int64_t base = 128 * static_cast<int64_t>(1 + rng() % 1000);  // a bucket's start
      for (uint64_t seq = 1; seq <= n; ++seq) {
        const Event e{.time_us = base + static_cast<int64_t>(rng() % (round % 2 ? 4 : 128)),
                      .seq = seq};
        q.Push(e);
        want.emplace_back(e.time_us, e.seq);
      }
      std::sort(want.begin(), want.end());
      std::vector<std::pair<int64_t, uint64_t>> got;
      while (!q.empty()) {
        const Event e = q.Pop();
        got.emplace_back(e.time_us, e.seq);
      }
      ASSERT_EQ(got, want) << n << " events, round " << round;
    }
  }
}

// Against an ordered set of the same events: pushes at or after the time last
// taken, near (the same bucket), in the wheel, far beyond it, exactly at its
// edges, and many of one time, interleaved with pops, over times that wrap
// the wheel many times; and Before() against the same.
TEST(EventQueue, AgreesWithASortOverEveryDistanceAhead) {
  std::mt19937_64 rng(11);
  int said_next = 0;
  for (int round = 0; round < 50; ++round) {
    EventQueue<Event> q;
    std::set<std::pair<int64_t, uint64_t>> pending;  // what q holds, in order
    uint64_t seq = 0;
    int64_t now = static_cast<int64_t>(rng() % 100'000);
    for (int step = 0; step < 20'000; ++step) {
      if (pending.empty() || rng() % 2 == 0) {
        int64_t ahead = 0;
        switch (rng() % 7) {
          case 0:
            ahead = 0;
            break;
          case 1:
            ahead = static_cast<int64_t>(rng() % 128);
            break;
          case 2:
            ahead = static_cast<int64_t>(rng() % (128 * 4096));
            break;
          case 3:
            ahead = 128 * 4096 - 1 + static_cast<int64_t>(rng() % 3);
            break;
          case 4:
            ahead = static_cast<int64_t>(rng() % 100'000'000);
            break;
          case 5:  // many events of one time, near, in the wheel and far
            ahead = static_cast<int64_t>(rng() % 4) * 400'000;
            break;
          default:
            ahead = static_cast<int64_t>(rng() % 1000);
            break;
        }
        const Event e{.time_us = now + ahead, .seq = seq++};
        // Before() may say "not known", never "next" of an event that is not.
        if (q.Before(e)) {
          ASSERT_TRUE(pending.empty() || std::make_pair(e.time_us, e.seq) < *pending.begin())
              << "round " << round << ", step " << step;
          ++said_next;
        }
        q.Push(e);
        pending.emplace(e.time_us, e.seq);
      } else {
        const Event got = q.Pop();
        ASSERT_EQ(std::make_pair(got.time_us, got.seq), *pending.begin())
            << "round " << round << ", step " << step;
        now = got.time_us;
        pending.erase(pending.begin());
      }
      ASSERT_EQ(q.size(), pending.size());
    }
  }
  EXPECT_GT(said_next, 1000);  // and it does say so
}

}  // namespace
}  // namespace sluice::sim
