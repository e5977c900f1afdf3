// sluice/algorithm/bucket_rate.h: a rate in the integer units the bucket
// algorithms (token_bucket, gcra, leaky_bucket) compute in.
//
// A rate of `limit` per `period` is `limit / period_us` tokens per microsecond,
// rarely a whole number. To stay exact in 64-bit integers, the bucket
// algorithms count in *ticks*: `ticks_per_us` ticks arrive every microsecond
// and one token is `ticks_per_token` ticks, with the fraction reduced
// (100/s -> 1 tick/us, 10000 ticks/token; 3/250ms -> 3 ticks/us, 250000
// ticks/token). gcra keeps its arrival time as `now_us * ticks_per_us` in one
// signed 64-bit word, so ticks_per_us is capped at kMaxTicksPerMicro: that
// keeps epoch times representable until 2112, and an arrival time (now plus
// at most 2^61 ticks of capacity) until 2077. A rate whose reduced
// numerator is larger is replaced by the closest slower rate that fits
// (the best rational approximation from below), so the guarantee
// "at most burst + rate*T" still holds; `exact` says whether that happened.
//
// Thread-safety: plain value.
#ifndef SLUICE_ALGORITHM_BUCKET_RATE_H_
#define SLUICE_ALGORITHM_BUCKET_RATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "sluice/rate.h"

namespace sluice {

inline constexpr int64_t kMaxTicksPerMicro = 2048;

struct BucketRate {
  int64_t ticks_per_us = 1;
  int64_t ticks_per_token = 1;
  bool exact = true;

  // The emission interval 1/rate, rounded up to a whole microsecond.
  Duration CeilInterval() const {
    return Duration::Micros((ticks_per_token + ticks_per_us - 1) / ticks_per_us);
  }
};

// Fails when `rate` is invalid (see ValidateRate) or faster than
// kMaxTicksPerMicro tokens per microsecond.
absl::StatusOr<BucketRate> MakeBucketRate(const Rate& rate);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_BUCKET_RATE_H_
