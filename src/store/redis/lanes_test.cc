// Coalescing's bookkeeping (store/redis/lanes.h), without Redis: what is
// sent at once, what waits, in what order and how many to a call, and what
// expires unsent.
#include "store/redis/lanes.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
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

}  // namespace
}  // namespace sluice::redis
