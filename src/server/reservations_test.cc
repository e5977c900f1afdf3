#include "server/reservations.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

const Time kNow = Time::FromUnixMicros(1'800'000'000'000'000);

TEST(Reservations, SettledOnceBeforeTheyExpire) {
  Reservations open(/*max=*/4);
  const Time soon = kNow + Duration::Millis(10);
  const Time later = kNow + Duration::Hours(1);
  open.Add("a", soon, kNow);
  open.Add("b", later, kNow);
  EXPECT_FALSE(open.Take("a", kNow + Duration::Millis(10)));  // expired
  EXPECT_TRUE(open.Take("b", kNow + Duration::Millis(10)));
  EXPECT_FALSE(open.Take("b", kNow + Duration::Millis(10)));  // once
  EXPECT_FALSE(open.Take("never given", kNow));
}

TEST(Reservations, AFullRecordForgetsTheOldestOpenOneFirst) {
  // Reservations never settled (a caller's that settles some of its checks,
  // or a flood's) cannot keep a prompt caller from its reservation.
  Reservations open(/*max=*/3);
  const Time later = kNow + Duration::Hours(1);
  open.Add("never settled 1", later, kNow);
  open.Add("never settled 2", later, kNow);
  open.Add("never settled 3", later, kNow);
  open.Add("prompt", later, kNow);
  EXPECT_TRUE(open.Take("prompt", kNow + Duration::Seconds(1)));
  EXPECT_FALSE(open.Take("never settled 1", kNow));  // forgotten: its estimate stays its cost
  EXPECT_TRUE(open.Take("never settled 2", kNow));
  // Only open ones count: two more, and the third is still there.
  open.Add("d", later, kNow);
  open.Add("e", later, kNow);
  EXPECT_TRUE(open.Take("never settled 3", kNow));
  EXPECT_TRUE(open.Take("d", kNow));
  EXPECT_TRUE(open.Take("e", kNow));
}

TEST(Reservations, ALateSettleIsKeptHoweverManyCameAndWentMeanwhile) {
  // A long request's reservation (a model's answer, an upload) is settled
  // minutes later; meanwhile many short ones are given and settled.
  Reservations open(/*max=*/4);
  const Time later = kNow + Duration::Hours(1);
  open.Add("long", later, kNow);
  for (int i = 0; i < 100'000; ++i) {
    const std::string id = "short " + std::to_string(i);
    open.Add(id, later, kNow);
    ASSERT_TRUE(open.Take(id, kNow)) << i;
  }
  EXPECT_TRUE(open.Take("long", kNow));
}

TEST(Reservations, TellsSignaturesApartByTheirFirst16Characters) {
  Reservations open;
  const Time later = kNow + Duration::Hours(1);
  open.Add("0123456789abcdefXXXX", later, kNow);
  EXPECT_FALSE(open.Take("0123456789abcdeX", kNow));
  EXPECT_TRUE(open.Take("0123456789abcdefYYYY", kNow));
}

TEST(ReleasedSlots, EachNameOnceAmongTheLastOnesSeen) {
  ReleasedSlots released;
  EXPECT_TRUE(released.FirstTime(7));
  EXPECT_FALSE(released.FirstTime(7));
  EXPECT_TRUE(released.FirstTime(8));
  // kSeenSlots names later, 7 is forgotten (the oldest first); 8 is not yet.
  for (uint64_t n = 100; n < 100 + kSeenSlots - 1; ++n) EXPECT_TRUE(released.FirstTime(n));
  EXPECT_FALSE(released.FirstTime(8));
  EXPECT_TRUE(released.FirstTime(7));
  EXPECT_FALSE(released.FirstTime(100 + kSeenSlots - 2));
}

}  // namespace
}  // namespace sluice::server
