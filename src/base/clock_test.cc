#include "sluice/clock.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(CoarseClockTest, FollowsItsSourceAndNeverGoesBack) {
  ManualClock source(Time::FromUnixMicros(1'000'000));
  CoarseClock coarse(Duration::Micros(100), source);
  EXPECT_EQ(coarse.Now(), Time::FromUnixMicros(1'000'000));
  source.Advance(Duration::Seconds(5));
  for (int i = 0; i < 5'000 && coarse.Now() != source.Now(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_EQ(coarse.Now(), Time::FromUnixMicros(6'000'000));
  source.Set(Time::FromUnixMicros(2'000'000));  // a source set back
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(coarse.Now(), Time::FromUnixMicros(6'000'000));
}

// Against the system clock: never ahead, never back, and behind by about
// the refresh interval (what the scheduler adds is printed; the bound
// asserted is loose, since a test machine's cores may all be busy).
TEST(CoarseClockTest, StalenessAgainstTheSystemClock) {
  const SystemClock& system = SystemClock::Default();
  CoarseClock coarse(Duration::Micros(250), system);
  std::vector<int64_t> behind_us;
  Time last = coarse.Now();
  for (int i = 0; i < 4'000; ++i) {
    const Time c = coarse.Now();
    const Time s = system.Now();
    ASSERT_LE(c, s);
    ASSERT_GE(c, last);
    last = c;
    behind_us.push_back((s - c).micros());
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::sort(behind_us.begin(), behind_us.end());
  const int64_t median = behind_us[behind_us.size() / 2];
  const int64_t p99 = behind_us[behind_us.size() * 99 / 100];
  std::printf("coarse clock behind the system clock: median %lld us, p99 %lld us, max %lld us\n",
              static_cast<long long>(median), static_cast<long long>(p99),
              static_cast<long long>(behind_us.back()));
  EXPECT_LT(median, 1'000);
  EXPECT_LT(behind_us.back(), 100'000);
}

}  // namespace
}  // namespace sluice
