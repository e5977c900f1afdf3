#include "sim/stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace sluice::sim {
namespace {

// The most times of `times` (in order) in any interval (t - window, t].
int64_t MostInAnyWindow(const std::vector<int64_t>& times, int64_t window) {
  int64_t most = 0;
  size_t first = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    while (times[first] <= times[i] - window) ++first;
    most = std::max(most, static_cast<int64_t>(i - first + 1));
  }
  return most;
}

int64_t Rolling(const std::vector<int64_t>& times, int64_t window) {
  RollingMax m(Duration::Micros(window));
  for (int64_t t : times) m.Add(t);
  return m.max();
}

TEST(RollingMax, CountsTheEventsOfTheBusiestWindowExactly) {
  // (t - 10, t]: 0 and 10 are never in one window, 1..10 are.
  EXPECT_EQ(Rolling({0, 10}, 10), 1);
  EXPECT_EQ(Rolling({0, 9}, 10), 2);
  EXPECT_EQ(Rolling({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10), 10);
  EXPECT_EQ(Rolling({5, 5, 5, 5}, 1), 4);  // one instant
  EXPECT_EQ(Rolling({}, 10), 0);
}

TEST(RollingMax, AgreesWithCountingEveryWindowOverGapsOfEverySize) {
  // Dense runs (a byte a gap), gaps of several bytes, equal times, a ring
  // that empties and fills again, and growth past its first size.
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int64_t window = int64_t{1} << (rng() % 40);
    std::vector<int64_t> times;
    int64_t t = static_cast<int64_t>(rng() % 1000);
    const int n = static_cast<int>(rng() % 5000);
    for (int i = 0; i < n; ++i) {
      switch (rng() % 8) {
        case 0:
          t += 0;
          break;
        case 1:
          t += static_cast<int64_t>(rng() % (int64_t{1} << 45));
          break;
        case 2:
          t += window;
          break;
        default:
          t += static_cast<int64_t>(rng() % 3);
          break;
      }
      times.push_back(t);
    }
    ASSERT_EQ(Rolling(times, window), MostInAnyWindow(times, window))
        << "round " << round << ", window " << window;
  }
}

}  // namespace
}  // namespace sluice::sim
