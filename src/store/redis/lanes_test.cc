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

// Requests asked together (a loop's turn, RedisStore): as many as a call
// carries go in one call when a call may go, in order; the rest wait for
// the next answer. With every call in flight they all wait.
TEST(LanesTest, RequestsAskedTogetherGoInOneCall) {
  Lanes<Item> lanes(4);
  const Clock::time_point t = Clock::now();
  const Clock::time_point later = t + std::chrono::seconds(10);
  auto asked = [&](int from, int to) {
    Lanes<Item>::Batch batch;
    for (int id = from; id <= to; ++id) batch.push_back(At(id, later));
    return batch;
  };
  EXPECT_EQ(Ids(lanes.Submit(0, asked(1, 3))), (std::vector<int>{1, 2, 3}));
  // A second call may go beside the first: a call's worth, the rest waits.
  EXPECT_EQ(Ids(lanes.Submit(0, asked(4, 9))), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(lanes.Submit(0, asked(10, 11)).empty());
  Lanes<Item>::Batch expired;
  EXPECT_EQ(Ids(lanes.Next(0, t, expired, 3)), (std::vector<int>{8, 9, 10, 11}));
  EXPECT_TRUE(lanes.Next(0, t, expired, 4).empty());
  EXPECT_TRUE(lanes.Next(0, t, expired, 4).empty());
  // Nothing in flight: at most a call's worth, the rest with its answer.
  EXPECT_EQ(Ids(lanes.Submit(0, asked(12, 17))), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(Ids(lanes.Next(0, t, expired, 4)), (std::vector<int>{16, 17}));
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
  // The call of 1 answered, 2 still in flight: 3 and 4 go (their share,
  // LanesTest.WithAnotherCallInFlightACallCarriesItsShare), then 5 with
  // 2's answer. Then the calls of 3 and 4, and of 5, are answered.
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), (std::vector<int>{3, 4}));
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), std::vector<int>{5});
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 2).empty());
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 1).empty());
  // The lane is free, and hot since the call of two: 6 waits and asks for
  // a flush; 7 makes two, and the two go together.
  EXPECT_TRUE(lanes.Submit(0, At(6, later), &flush).empty());
  EXPECT_TRUE(flush);
  flush = false;
  EXPECT_EQ(Ids(lanes.Submit(0, At(7, later), &flush)), (std::vector<int>{6, 7}));
  EXPECT_FALSE(flush);
  // 8 waits too; the flush 6 asked for is still due, and sends it alone.
  EXPECT_TRUE(lanes.Submit(0, At(8, later), &flush).empty());
  EXPECT_FALSE(flush);
  EXPECT_EQ(Ids(lanes.Flush(0, Clock::now(), expired)), std::vector<int>{8});
  // Both calls in flight: 9 waits for an answer, whatever the flush.
  EXPECT_TRUE(lanes.Submit(0, At(9, later), &flush).empty());
  EXPECT_TRUE(lanes.Flush(0, Clock::now(), expired).empty());
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 2)), std::vector<int>{9});
  EXPECT_TRUE(expired.empty());
  // Without `flush_later` nothing lingers.
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 1).empty());
  EXPECT_EQ(Ids(lanes.Submit(0, At(11, later))), std::vector<int>{11});
}

// While another call is in flight, a call carries a third of the requests
// going round (two calls in flight and the answers being handed out): in
// flight, waiting, and those of the call just answered. With one call in
// flight at most, every waiting request goes with the next call.
TEST(LanesTest, WithAnotherCallInFlightACallCarriesItsShare) {
  Lanes<Item> lanes(64);
  const Clock::time_point later = Clock::now() + std::chrono::seconds(10);
  Lanes<Item>::Batch expired;
  auto ids = [](int from, int to) {
    std::vector<int> out;
    for (int id = from; id <= to; ++id) out.push_back(id);
    return out;
  };
  EXPECT_EQ(Ids(lanes.Submit(0, At(1, later))), std::vector<int>{1});
  EXPECT_EQ(Ids(lanes.Submit(0, At(2, later))), std::vector<int>{2});
  for (int id = 3; id <= 30; ++id) EXPECT_TRUE(lanes.Submit(0, At(id, later)).empty());
  // 1 in flight (2), 28 waiting, 1 answered: 30 going round, 10 a call.
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), ids(3, 12));
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), ids(13, 22));
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 10)), ids(23, 30));
  EXPECT_TRUE(lanes.Next(0, Clock::now(), expired, 10).empty());
  // One call in flight (23-30): 31 goes at once, 32-40 wait.
  EXPECT_EQ(Ids(lanes.Submit(0, At(31, later))), std::vector<int>{31});
  for (int id = 32; id <= 40; ++id) EXPECT_TRUE(lanes.Submit(0, At(id, later)).empty());
  // 31 in flight, 9 waiting, 8 answered: 18 going round, 6 a call.
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 8)), ids(32, 37));
  EXPECT_EQ(Ids(lanes.Next(0, Clock::now(), expired, 1)), ids(38, 40));
  EXPECT_TRUE(expired.empty());

  // Never more than max_batch.
  Lanes<Item> small(4);
  small.Submit(0, At(1, later));
  small.Submit(0, At(2, later));
  for (int id = 3; id <= 40; ++id) small.Submit(0, At(id, later));
  EXPECT_EQ(Ids(small.Next(0, Clock::now(), expired, 1)), ids(3, 6));

  // One call in flight at most: nothing to share with.
  Lanes<Item> one(64, Clock::duration::zero(), 1);
  one.Submit(0, At(1, later));
  for (int id = 2; id <= 30; ++id) EXPECT_TRUE(one.Submit(0, At(id, later)).empty());
  EXPECT_EQ(Ids(one.Next(0, Clock::now(), expired, 1)), ids(2, 30));
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
