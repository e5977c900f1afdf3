// sluice/algorithm/gcra.h: the generic cell rate algorithm.
//
// The same admission set as token_bucket with equal rate and burst, kept in
// one 64-bit word: the theoretical arrival time (TAT) of the next request, in
// ticks (now_us * ticks_per_us, see bucket_rate.h). The bucket is "full" when
// TAT <= now; a request of cost c passes when TAT + c*interval - now <=
// burst*interval. One word makes it the lock-free and Redis-friendly form.
// Time going backwards makes TAT look further away: it grants nothing.
//
// Pure functions; callers serialize access to one State.
//
//   auto config = sluice::GcraConfig::Create({.rate = *sluice::ParseRate("100/s"), .burst = 20});
//   sluice::GcraState state;
//   auto [next, decision] = sluice::Decide(*config, state, now, 1);
#ifndef SLUICE_ALGORITHM_GCRA_H_
#define SLUICE_ALGORITHM_GCRA_H_

#include <cstdint>

#include "sluice/algorithm/token_bucket.h"

namespace sluice {

struct GcraConfig : BucketConfig {
  static absl::StatusOr<GcraConfig> Create(const BucketOptions& options);
};

struct GcraState {
  int64_t tat_ticks = 0;  // 0 (or any TAT <= now): a full bucket
};

Outcome<GcraState> Decide(const GcraConfig& config, GcraState state, Time now, int64_t cost);
GcraState Refund(const GcraConfig& config, GcraState state, Time taken_at, int64_t cost);
// Takes `cost` at `now` whether or not it fits: an arrival time further
// ahead than the burst allows is debt (kMaxDebtLimits, outcome.h).
GcraState Charge(const GcraConfig& config, GcraState state, Time now, int64_t cost);
Time FreshAt(const GcraConfig& config, const GcraState& state);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_GCRA_H_
