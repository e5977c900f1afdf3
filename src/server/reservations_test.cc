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

TEST(Reservations, AFullRecordForgetsTheOldestFirst) {
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
  // The settled ones count among the last given: two more forget the third.
  open.Add("d", later, kNow);
  open.Add("e", later, kNow);
  EXPECT_FALSE(open.Take("never settled 3", kNow));
  EXPECT_TRUE(open.Take("d", kNow));
  EXPECT_TRUE(open.Take("e", kNow));
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
