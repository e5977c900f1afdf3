#include "sim/event_queue.h"

#include <gtest/gtest.h>

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
