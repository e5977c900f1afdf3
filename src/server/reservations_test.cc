#include "server/reservations.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

const Time kNow = Time::FromUnixMicros(1'800'000'000'000'000);

TEST(SpentLeases, ALeaseIsSpentOnceUntilItEnds) {
  SpentLeases spent;
  const Time ends = kNow + Duration::Seconds(60);
  EXPECT_EQ(spent.Take("A-signature-of-a-lease", ends, kNow), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("B-signature-of-a-lease", ends, kNow), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("A-signature-of-a-lease", ends, kNow), SpentLeases::Spend::kAgain);
  EXPECT_EQ(spent.Take("A-signature-of-a-lease", ends, ends - Duration::Micros(1)),
            SpentLeases::Spend::kAgain);
  // Ended, the lease is forgotten (the server gives nothing back for it).
  EXPECT_EQ(spent.Take("A-signature-of-a-lease", ends + Duration::Seconds(60), ends),
            SpentLeases::Spend::kFirst);
}

TEST(SpentLeases, AFullTableSpendsNothingUntilLeasesEnd) {
  SpentLeases spent(/*max=*/3);
  const Time soon = kNow + Duration::Millis(10);
  const Time later = kNow + Duration::Seconds(60);
  EXPECT_EQ(spent.Take("0-signature-of-a-lease", soon, kNow), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("1-signature-of-a-lease", later, kNow), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("2-signature-of-a-lease", later, kNow), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("3-signature-of-a-lease", later, kNow), SpentLeases::Spend::kFull);
  // The first lease has ended, but a full table is swept at most every
  // 100 ms (it was at kNow).
  EXPECT_EQ(spent.Take("3-signature-of-a-lease", later, kNow + Duration::Millis(50)),
            SpentLeases::Spend::kFull);
  const Time swept = kNow + Duration::Millis(100);
  EXPECT_EQ(spent.Take("3-signature-of-a-lease", later, swept), SpentLeases::Spend::kFirst);
  EXPECT_EQ(spent.Take("1-signature-of-a-lease", later, swept), SpentLeases::Spend::kAgain);
  EXPECT_EQ(spent.Take("4-signature-of-a-lease", later, swept), SpentLeases::Spend::kFull);
}

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

}  // namespace
}  // namespace sluice::server
