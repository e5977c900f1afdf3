// Coalescing's bookkeeping (store/redis/lanes.h), without Redis: what is
// sent at once, what waits, in what order and how many to a call, and what
// expires unsent.
#include "store/redis/lanes.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace sluice::redis {
namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  int id = 0;
  Clock::time_point deadline;
};

std::unique_ptr<Item> At(int id, Clock::time_point deadline) {
  return std::make_unique<Item>(Item{id, deadline});
}

std::vector<int> Ids(const Lanes<Item>::Batch& batch) {
  std::vector<int> out;
  for (const auto& item : batch) out.push_back(item->id);
  return out;
}

TEST(LanesTest, TwoCallsInFlightThenTheRestWaitAndGoInOrderInBoundedCalls) {
  Lanes<Item> lanes(3);
  const Clock::time_point t = Clock::now();
  const Clock::time_point later = t + std::chrono::seconds(10);
  EXPECT_EQ(Ids(lanes.Submit(0, At(1, later))), std::vector<int>{1});
  EXPECT_EQ(Ids(lanes.Submit(0, At(2, later))), std::vector<int>{2});
  for (int id = 3; id <= 7; ++id) EXPECT_TRUE(lanes.Submit(0, At(id, later)).empty());
  // Another lane (a Cluster slot) is not held up by this one.
  EXPECT_EQ(Ids(lanes.Submit(9, At(100, later))), std::vector<int>{100});
  Lanes<Item>::Batch expired;
  EXPECT_EQ(Ids(lanes.Next(0, t, expired)), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(Ids(lanes.Next(0, t, expired)), (std::vector<int>{6, 7}));
  EXPECT_TRUE(expired.empty());
  // Nothing waits: each answer frees a call; a new request then goes at once.
  EXPECT_TRUE(lanes.Next(0, t, expired).empty());
  EXPECT_EQ(Ids(lanes.Submit(0, At(8, later))), std::vector<int>{8});
  EXPECT_TRUE(lanes.Submit(0, At(9, later)).empty());
}

TEST(LanesTest, OneCallInFlightThenTheRestWaitForItsAnswer) {
  // store.redis.calls_in_flight: 1.
  Lanes<Item> lanes(64, Clock::duration::zero(), 1);
  const Clock::time_point t = Clock::now();
  const Clock::time_point later = t + std::chrono::seconds(10);
  EXPECT_EQ(Ids(lanes.Submit(0, At(1, later))), std::vector<int>{1});
  for (int id = 2; id <= 4; ++id) EXPECT_TRUE(lanes.Submit(0, At(id, later)).empty());
  // Another lane (a Cluster slot) has its own call.
  EXPECT_EQ(Ids(lanes.Submit(9, At(100, later))), std::vector<int>{100});
  EXPECT_TRUE(lanes.Submit(9, At(101, later)).empty());
  Lanes<Item>::Batch expired;
  EXPECT_EQ(Ids(lanes.Next(0, t, expired)), (std::vector<int>{2, 3, 4}));
  EXPECT_TRUE(lanes.Submit(0, At(5, later)).empty());  // 2, 3, 4 are in flight
  EXPECT_EQ(Ids(lanes.Next(0, t, expired)), std::vector<int>{5});
  EXPECT_TRUE(lanes.Next(0, t, expired).empty());
  EXPECT_EQ(Ids(lanes.Submit(0, At(6, later))), std::vector<int>{6});  // none in flight
  EXPECT_EQ(Ids(lanes.Next(9, t, expired)), std::vector<int>{101});
  EXPECT_TRUE(expired.empty());
}

TEST(LanesTest, ARequestWhoseDeadlinePassedWhileItWaitedIsNeverSent) {
  Lanes<Item> lanes(64);
  const Clock::time_point t = Clock::now();
  lanes.Submit(0, At(1, t));
  lanes.Submit(0, At(2, t));
  lanes.Submit(0, At(3, t + std::chrono::milliseconds(5)));
  lanes.Submit(0, At(4, t + std::chrono::seconds(10)));
  Lanes<Item>::Batch expired;
  EXPECT_EQ(Ids(lanes.Next(0, t + std::chrono::milliseconds(5), expired)), std::vector<int>{4});
  EXPECT_EQ(Ids(expired), std::vector<int>{3});
}

TEST(LanesTest, ABatchOfOneSendsEveryRequestAtOnce) {
  Lanes<Item> lanes(1);
  const Clock::time_point later = Clock::now() + std::chrono::seconds(10);
  for (int id = 1; id <= 5; ++id)
    EXPECT_EQ(Ids(lanes.Submit(0, At(id, later))), std::vector<int>{id});
}

// The linger: after a call of several requests is answered, a request that
// finds a free call waits for as many as that call carried, or for the
// caller's Flush; after a call of one, or once the lane has cooled, it
// goes at once.
TEST(LanesTest, AfterACallOfSeveralTheNextWaitsForAsManyOrTheFlush) {
  Lanes<Item> lanes(64, std::chrono::milliseconds(100));
  const Clock::time_point later = Clock::now() + std::chrono::seconds(10);
  Lanes<Item>::Batch expired;
  bool flush = false;
  // Nothing answered yet: at once, and no flush asked for.
  EXPECT_EQ(Ids(lanes.Submit(0, At(1, later), &flush)), std::vector<int>{1});
  EXPECT_FALSE(flush);
  EXPECT_EQ(Ids(lanes.Submit(0, At(2, later), &flush)), std::vector<int>{2});
  for (int id = 3; id <= 5; ++id) EXPECT_TRUE(lanes.Submit(0, At(id, later), &flush).empty());
  EXPECT_FALSE(flush);
  // The call of 1 answered: 3, 4, 5 go. Then the call of 3 (2 was alone).
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), (std::vector<int>{3, 4, 5}));
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 1).empty());
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 3).empty());
  // The lane is free, and hot: 6 and 7 wait, the first asks for a flush;
  // 8 makes three, and the three go together.
  EXPECT_TRUE(lanes.Submit(0, At(6, later), &flush).empty());
  EXPECT_TRUE(flush);
  flush = false;
  EXPECT_TRUE(lanes.Submit(0, At(7, later), &flush).empty());
  EXPECT_FALSE(flush);  // one flush is due already
  EXPECT_EQ(Ids(lanes.Submit(0, At(8, later), &flush)), (std::vector<int>{6, 7, 8}));
  // 9 waits too; the flush that was due sends it alone, a call in flight.
  EXPECT_TRUE(lanes.Submit(0, At(9, later), &flush).empty());
  EXPECT_EQ(Ids(lanes.Flush(0, Clock::now(), expired)), std::vector<int>{9});
  // Both calls in flight: 10 waits for an answer, whatever the flush.
  EXPECT_TRUE(lanes.Submit(0, At(10, later), &flush).empty());
  EXPECT_TRUE(lanes.Flush(0, Clock::now(), expired).empty());
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 3)), std::vector<int>{10});
  EXPECT_TRUE(expired.empty());
  // Without `flush_later` nothing lingers.
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 1).empty());
  EXPECT_EQ(Ids(lanes.Submit(0, At(11, later))), std::vector<int>{11});
}

TEST(LanesTest, TheLaneCoolsAfterTenLingersAndALingerOfZeroNeverWaits) {
  Lanes<Item> lanes(64, std::chrono::milliseconds(1));
  const Clock::time_point later = Clock::now() + std::chrono::seconds(10);
  Lanes<Item>::Batch expired;
  bool flush = false;
  lanes.Submit(0, At(1, later), &flush);
  lanes.Submit(0, At(2, later), &flush);
  lanes.Submit(0, At(3, later), &flush);
  lanes.Next(0, Clock::now(), expired, 2);  // 3 goes
  lanes.Next(0, Clock::now(), expired, 1);  // hot since the first answer
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
  EXPECT_EQ(Ids(lanes.Submit(0, At(4, later), &flush)), std::vector<int>{4});
  EXPECT_FALSE(flush);

  Lanes<Item> eager(64);
  eager.Submit(0, At(1, later), &flush);
  eager.Submit(0, At(2, later), &flush);
  eager.Next(0, Clock::now(), expired, 5);
  EXPECT_EQ(Ids(eager.Submit(0, At(3, later), &flush)), std::vector<int>{3});
  EXPECT_FALSE(flush);
}

}  // namespace
}  // namespace sluice::redis
