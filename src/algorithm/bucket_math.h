// The arithmetic the three bucket algorithms share. Internal.
//
// token_bucket, gcra and leaky_bucket police encode their state differently
// (tokens + time, one arrival time, level + time) but all reduce it to the
// same number at `now`: `used`, the ticks of the bucket's capacity in use.
// From there the decision is the same, so it is written once, here.
#ifndef SLUICE_ALGORITHM_BUCKET_MATH_H_
#define SLUICE_ALGORITHM_BUCKET_MATH_H_

#include <algorithm>
#include <cstdint>

#include "sluice/algorithm/outcome.h"

#include "sluice/algorithm/token_bucket.h"
#include "sluice/decision.h"

namespace sluice::internal {

// a / b rounded up, for a >= 0, b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return a <= 0 ? 0 : (a - 1) / b + 1; }

// floor(a / b) for any sign of a, b > 0.
constexpr int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

struct BucketStep {
  bool consumed = false;   // state must be updated to `used_after`
  int64_t used_after = 0;  // ticks in use after the decision
  Decision decision;
};

// The most ticks a charge may leave in use: the capacity and a debt of at
// most kMaxDebtLimits capacities, and at most 2^52 ticks of debt (the
// Redis functions compute in doubles).
inline int64_t MaxUsedTicks(const BucketConfig& config) {
  constexpr int64_t kTwo52 = int64_t{1} << 52;
  const int64_t capacity = config.capacity_ticks();
  const int64_t debt = capacity > kTwo52 / kMaxDebtLimits ? kTwo52 : capacity * kMaxDebtLimits;
  return capacity + debt;
}

// Cost units left with `used` ticks in use: below zero by a debt (a charge
// past the capacity, or a gcra clock that went back), down to the most
// debt MaxUsedTicks allows. Past 2^52 whole microseconds' ticks the Redis
// functions do not form `used` (gcra: a clock gone far back); both then
// say the most debt.
inline int64_t Remaining(const BucketConfig& config, int64_t used) {
  constexpr int64_t kTwo52 = int64_t{1} << 52;
  const int64_t capacity = config.capacity_ticks();
  const int64_t per_token = config.bucket_rate().ticks_per_token;
  if (used <= capacity) return (capacity - used) / per_token;
  const int64_t most = MaxUsedTicks(config) - capacity;
  const bool far = used - used % config.bucket_rate().ticks_per_us > kTwo52;
  return -CeilDiv(far ? most : std::min(used - capacity, most), per_token);
}

// `used` >= 0 may exceed the capacity when the clock went backwards (gcra).
inline BucketStep BucketDecide(const BucketConfig& config, int64_t used, int64_t cost) {
  const int64_t per_us = config.bucket_rate().ticks_per_us;
  const int64_t per_token = config.bucket_rate().ticks_per_token;
  const int64_t capacity = config.capacity_ticks();
  BucketStep step;
  Decision& d = step.decision;
  d.limit = config.burst();
  if (cost > config.burst()) {  // checked first: cost * per_token may overflow
    d.retry_after = Duration::Infinite();
    d.remaining = Remaining(config, used);
    d.reset_after = Duration::Micros(CeilDiv(used, per_us));
    step.used_after = used;
    return step;
  }
  const int64_t cost_ticks = cost * per_token;  // <= capacity < 2^62
  if (used <= capacity - cost_ticks) {
    step.consumed = cost > 0;
    step.used_after = used + cost_ticks;
    d.allowed = true;
    d.remaining = (capacity - step.used_after) / per_token;
    d.reset_after = Duration::Micros(CeilDiv(step.used_after, per_us));
    return step;
  }
  // Denied: wait until enough has drained that used + cost fits.
  step.used_after = used;
  d.remaining = Remaining(config, used);
  d.reset_after = Duration::Micros(CeilDiv(used, per_us));
  d.retry_after = Duration::Micros(CeilDiv(used - (capacity - cost_ticks), per_us));
  return step;
}

// `used` after a charge of `cost` whether or not it fits, up to MaxUsedTicks.
inline int64_t ChargedUsed(const BucketConfig& config, int64_t used, int64_t cost) {
  const int64_t max = MaxUsedTicks(config);
  if (cost <= 0) return used;
  // Far ahead already (a clock that went back a long way): nothing to add.
  if (used >= max || used > (int64_t{1} << 52)) return used;
  const int64_t per_token = config.bucket_rate().ticks_per_token;
  return cost > (max - used) / per_token ? max : used + cost * per_token;
}

// token_bucket and leaky_bucket police decide as of `last` when the clock is
// behind it (nothing refills or leaks meanwhile), so the durations
// BucketDecide measured from `last` are `lag_us` = last - now longer from now.
inline void MeasureFromNow(Decision& d, int64_t lag_us) {
  if (lag_us <= 0) return;
  if (d.reset_after > Duration::Zero()) d.reset_after += Duration::Micros(lag_us);
  if (!d.allowed && !d.retry_after.IsInfinite()) d.retry_after += Duration::Micros(lag_us);
}

}  // namespace sluice::internal

#endif  // SLUICE_ALGORITHM_BUCKET_MATH_H_
