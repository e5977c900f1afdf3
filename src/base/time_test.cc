#include "sluice/time.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/clock.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

TEST(ParseDuration, AcceptsUnitsAndFractions) {
  EXPECT_EQ(*ParseDuration("250ms"), Duration::Millis(250));
  EXPECT_EQ(*ParseDuration("2s"), Duration::Seconds(2));
  EXPECT_EQ(*ParseDuration("1.5s"), Duration::Millis(1500));
  EXPECT_EQ(*ParseDuration("5m"), Duration::Minutes(5));
  EXPECT_EQ(*ParseDuration("5min"), Duration::Minutes(5));
  EXPECT_EQ(*ParseDuration("1h"), Duration::Hours(1));
  EXPECT_EQ(*ParseDuration("1d"), Duration::Days(1));
  EXPECT_EQ(*ParseDuration("100us"), Duration::Micros(100));
  EXPECT_EQ(*ParseDuration("0s"), Duration::Zero());
}

TEST(ParseDuration, RejectsWithReasons) {
  EXPECT_THAT(ParseDuration("5").status().message(), HasSubstr("missing unit"));
  EXPECT_THAT(ParseDuration("s").status().message(), HasSubstr("expected a number"));
  EXPECT_THAT(ParseDuration("-1s").status().message(), HasSubstr("negative"));
  EXPECT_THAT(ParseDuration("3 weeks").status().message(), HasSubstr("unknown unit"));
  EXPECT_THAT(ParseDuration("99999999999999999d").status().message(), HasSubstr("too"));
}

TEST(FormatDuration, PicksTheLargestExactUnit) {
  EXPECT_EQ(FormatDuration(Duration::Millis(250)), "250ms");
  EXPECT_EQ(FormatDuration(Duration::Minutes(2)), "2m");
  EXPECT_EQ(FormatDuration(Duration::Micros(1500)), "1500us");
  EXPECT_EQ(FormatDuration(Duration::Days(1)), "1d");
}

TEST(Duration, RoundsUpWhenTellingClientsToWait) {
  EXPECT_EQ(Duration::Micros(1).CeilSeconds(), 1);
  EXPECT_EQ(Duration::Seconds(2).CeilSeconds(), 2);
  EXPECT_EQ(Duration::Micros(2'000'001).CeilSeconds(), 3);
  EXPECT_EQ(Duration::Micros(1001).CeilMillis(), 2);
  EXPECT_EQ(Duration::Zero().CeilSeconds(), 0);
}

TEST(ManualClock, MovesOnlyWhenTold) {
  ManualClock clock(Time::FromUnixMicros(1000));
  EXPECT_EQ(clock.Now(), Time::FromUnixMicros(1000));
  clock.Advance(Duration::Seconds(1));
  EXPECT_EQ(clock.Now(), Time::FromUnixMicros(1'001'000));
  clock.Set(Time::FromUnixMicros(5));  // a clock step backwards
  EXPECT_EQ(clock.Now(), Time::FromUnixMicros(5));
}

TEST(SystemClock, IsMonotonicAndNearWallTime) {
  const SystemClock& clock = SystemClock::Default();
  const Time a = clock.Now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const Time b = clock.Now();
  EXPECT_GE(b - a, Duration::Millis(2));
  const int64_t wall = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  EXPECT_LT(std::abs(wall - b.unix_micros()), 5'000'000);
}

}  // namespace
}  // namespace sluice
