// Charge: a cost taken whether or not it fits (settled costs), for the four
// algorithms that carry debt. The debt is repaid at the limit's rate: the
// first request admitted after a charge comes exactly when the debt and the
// request fit, and a charge at the extremes saturates at kMaxDebtLimits
// without overflowing.
#include <cstdint>
#include <limits>

#include "conformance/algorithms.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

// A second boundary: windows start here.
constexpr Time kT0 = Time::FromUnixMicros(1'700'000'000'000'000);

template <typename Config>
Config Make(std::string_view rate) {
  absl::StatusOr<LimitConfig> c = MakeLimit(
      {.algorithm = std::is_same_v<Config, GcraConfig>          ? Algorithm::kGcra
                    : std::is_same_v<Config, TokenBucketConfig> ? Algorithm::kTokenBucket
                    : std::is_same_v<Config, FixedWindowConfig> ? Algorithm::kFixedWindow
                                                                : Algorithm::kSlidingWindow,
       .rate = MustParseRate(rate)});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::get<Config>(*c);
}

// The first time, in steps of `step` from `from`, at which a request of cost
// 1 is admitted, and the decision that admitted it; Decide's retry_after at
// `from` must say the same.
template <typename Config>
Time FirstAdmission(const Config& config, StateOf_t<Config> state, Time from, Duration step,
                    int max_steps) {
  const Decision first = CheckInPlace(config, state, from, 1);
  for (int i = 0; i < max_steps; ++i) {
    const Time at = from + step * i;
    if (CheckInPlace(config, state, at, 1).allowed) {
      EXPECT_FALSE(first.allowed);
      EXPECT_EQ(from + first.retry_after, at) << "retry_after " << first.retry_after.micros();
      return at;
    }
  }
  ADD_FAILURE() << "never admitted";
  return from;
}

TEST(Charge, BucketDebtIsRepaidAtTheRate) {
  // 10/s, burst 10, full: a charge of 35 leaves 25 tokens owed; one more
  // needs 26 refilled, 2.6 s.
  for (const bool gcra : {false, true}) {
    SCOPED_TRACE(gcra ? "gcra" : "token_bucket");
    Time first;
    if (gcra) {
      const auto c = Make<GcraConfig>("10/s");
      first = FirstAdmission(c, Charge(c, GcraState{}, kT0, 35), kT0, Duration::Millis(100), 100);
    } else {
      const auto c = Make<TokenBucketConfig>("10/s");
      first = FirstAdmission(c, Charge(c, TokenBucketState{}, kT0, 35), kT0, Duration::Millis(100),
                             100);
    }
    EXPECT_EQ(first, kT0 + Duration::Millis(2600));
  }
}

// A debt shows as remaining below zero, by the units owed, shrinking as
// it is repaid; the most debt a key may owe bounds it.
TEST(Charge, DebtShowsAsRemainingBelowZero) {
  auto Left = [](const auto& config, auto state, Time at) {
    return CheckInPlace(config, state, at, 1).remaining;
  };
  const auto gcra = Make<GcraConfig>("10/s");
  const GcraState g = Charge(gcra, GcraState{}, kT0, 35);
  EXPECT_EQ(Left(gcra, g, kT0), -25);
  EXPECT_EQ(Left(gcra, g, kT0 + Duration::Millis(1050)), -15);
  const auto bucket = Make<TokenBucketConfig>("10/s");
  const TokenBucketState b = Charge(bucket, TokenBucketState{}, kT0, 35);
  EXPECT_EQ(Left(bucket, b, kT0), -25);
  const auto fixed = Make<FixedWindowConfig>("10/s");
  const FixedWindowState f = Charge(fixed, FixedWindowState{}, kT0, 35);
  EXPECT_EQ(Left(fixed, f, kT0), -25);
  EXPECT_EQ(Left(fixed, f, kT0 + Duration::Seconds(1)), -15);
  const auto sliding = Make<SlidingWindowConfig>("10/s");
  const SlidingWindowState w = Charge(sliding, SlidingWindowState{}, kT0, 35);
  EXPECT_EQ(Left(sliding, w, kT0), -25);
  // An absurd charge: at most kMaxDebtLimits limits owed.
  const GcraState most = Charge(gcra, GcraState{}, kT0, std::numeric_limits<int64_t>::max() / 4);
  EXPECT_EQ(Left(gcra, most, kT0), -10 * kMaxDebtLimits);
}

TEST(Charge, FixedWindowCarriesDebtIntoTheNextWindows) {
  // 10/s: 35 charged in the window at kT0 leaves 25, then 15, then 5 for
  // the next windows: the first request passes at kT0 + 3 s, and 5 pass
  // in that window.
  const auto c = Make<FixedWindowConfig>("10/s");
  FixedWindowState s = Charge(c, FixedWindowState{}, kT0, 35);
  EXPECT_EQ(FirstAdmission(c, s, kT0, Duration::Millis(100), 100), kT0 + Duration::Seconds(3));
  EXPECT_EQ(FreshAt(c, s), kT0 + Duration::Seconds(4));
  int admitted = 0;
  for (int i = 0; i < 10; ++i)
    admitted += DecideInPlace(c, s, kT0 + Duration::Seconds(3), 1).allowed;
  EXPECT_EQ(admitted, 5);
  // Within the limit, a count lasts its window only, as before.
  FixedWindowState plain = Charge(c, FixedWindowState{}, kT0, 4);
  EXPECT_EQ(FreshAt(c, plain), kT0 + Duration::Seconds(1));
}

TEST(Charge, SlidingWindowCarriesDebtIntoTheNextWindows) {
  // 10/s: 35 in the window at kT0. Three windows on, 5 are left over and a
  // full limit behind them, whose weight has shrunk enough for one more at
  // 60% of that window: kT0 + 3.6 s.
  const auto c = Make<SlidingWindowConfig>("10/s");
  const SlidingWindowState s = Charge(c, SlidingWindowState{}, kT0, 35);
  EXPECT_EQ(FirstAdmission(c, s, kT0, Duration::Millis(100), 100), kT0 + Duration::Millis(3600));
  EXPECT_EQ(FreshAt(c, s), kT0 + Duration::Seconds(5));
}

TEST(Charge, ExtremesSaturateAtTheDebtBound) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  {
    const auto c = Make<FixedWindowConfig>("10/s");
    const FixedWindowState s = Charge(c, Charge(c, FixedWindowState{}, kT0, kHuge), kT0, kHuge);
    EXPECT_EQ(s.count, 10 * (kMaxDebtLimits + 1));
  }
  {
    const auto c = Make<SlidingWindowConfig>("1099511627776/366d");  // 2^40 per 366 days
    SlidingWindowState s = Charge(c, SlidingWindowState{}, kT0, kHuge);
    // Windows of 366 days: what 2^51 us (71 of them) repay, not 1024.
    const int64_t windows = (int64_t{1} << 51) / Duration::Days(366).micros();
    EXPECT_EQ(windows, 71);
    EXPECT_EQ(s.curr, (int64_t{1} << 40) * (1 + windows));
    const Decision d = CheckInPlace(c, s, kT0, 1);
    EXPECT_FALSE(d.allowed);
    EXPECT_GT(d.retry_after, Duration::Days(366) * windows);
  }
  {
    const auto c = Make<TokenBucketConfig>("10/s");
    TokenBucketState s = Charge(c, TokenBucketState{}, kT0, kHuge);
    // 1024 buckets owed: about 1025 seconds to a token.
    const Decision d = CheckInPlace(c, s, kT0, 1);
    EXPECT_EQ(d.retry_after, Duration::Millis(1024 * 1000 + 100));
    // Repaid across a long idle gap in one step, without overflow.
    EXPECT_TRUE(CheckInPlace(c, s, kT0 + Duration::Days(3650), 10).allowed);
  }
  {
    const auto c = Make<GcraConfig>("1000000/999us");
    GcraState s = Charge(c, Charge(c, GcraState{}, kT0, kHuge), kT0, kHuge);
    EXPECT_FALSE(CheckInPlace(c, s, kT0, 1).allowed);
    EXPECT_TRUE(CheckInPlace(c, s, kT0 + Duration::Days(3650), 1).allowed);
  }
}

}  // namespace
}  // namespace sluice::conformance
