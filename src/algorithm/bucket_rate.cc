#include "sluice/algorithm/bucket_rate.h"

#include <numeric>

#include "base/cat.h"

namespace sluice {
namespace {

// The largest fraction p/q <= num/den with p <= max_p. A direct search over
// p: it runs once per config, and its correctness is plain to see.
BucketRate BestLowerApproximation(int64_t num, int64_t den, int64_t max_p) {
  BucketRate best{0, 1, false};
  for (int64_t p = 1; p <= max_p; ++p) {
    const __int128 q = (static_cast<__int128>(p) * den + num - 1) / num;  // ceil: p/q <= num/den
    if (static_cast<__int128>(p) * best.ticks_per_token >
        static_cast<__int128>(best.ticks_per_us) * q) {
      best = {p, static_cast<int64_t>(q), false};
    }
  }
  const int64_t g = std::gcd(best.ticks_per_us, best.ticks_per_token);
  best.ticks_per_us /= g;
  best.ticks_per_token /= g;
  return best;
}

}  // namespace

absl::StatusOr<BucketRate> MakeBucketRate(const Rate& rate) {
  if (absl::Status s = ValidateRate(rate); !s.ok()) return s;
  const int64_t period_us = rate.period.micros();
  const int64_t g = std::gcd(rate.limit, period_us);
  const int64_t per_us = rate.limit / g;
  const int64_t per_token = period_us / g;
  if (per_us <= kMaxTicksPerMicro) return BucketRate{per_us, per_token, true};
  if (per_us / per_token >= kMaxTicksPerMicro) {
    return absl::InvalidArgumentError(internal::Cat(
        "rate ", FormatRate(rate), " is faster than the bucket algorithms' maximum of ",
        kMaxTicksPerMicro, " per microsecond; count cost in larger units"));
  }
  return BestLowerApproximation(per_us, per_token, kMaxTicksPerMicro);
}

}  // namespace sluice
