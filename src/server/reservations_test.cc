#include "server/reservations.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

const Time kNow = Time::FromUnixMicros(1'800'000'000'000'000);

TEST(Reservations, SettledOnceBeforeTheyExpireAndAFullRecordIsSweptAtMostEvery100Ms) {
  Reservations open(/*max=*/2);
  const Time soon = kNow + Duration::Millis(10);
  const Time later = kNow + Duration::Hours(1);
  EXPECT_TRUE(open.Add("a", soon, kNow));
  EXPECT_TRUE(open.Add("b", later, kNow));
  EXPECT_FALSE(open.Add("c", later, kNow));                         // full
  EXPECT_FALSE(open.Add("c", later, kNow + Duration::Millis(50)));  // "a" expired, not swept yet
  EXPECT_TRUE(open.Add("c", later, kNow + Duration::Millis(100)));
  EXPECT_FALSE(open.Take("a", kNow + Duration::Millis(100)));  // expired and dropped
  EXPECT_TRUE(open.Take("b", kNow + Duration::Millis(100)));
  EXPECT_FALSE(open.Take("b", kNow + Duration::Millis(100)));  // once
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
