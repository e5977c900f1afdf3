// sluice/algorithm/token_bucket.h: the token bucket.
//
// The bucket starts full with `burst` tokens and refills continuously at
// `rate`; a request of cost c passes when c tokens are there and takes them.
// Guarantee: over ANY interval of length T it admits at most burst + rate*T
// cost. State: the tokens (in ticks, see bucket_rate.h) and the time they
// were counted. Time going backwards refills nothing.
//
// Pure functions: no I/O, locks, allocation or clock reads. Thread-safety:
// callers serialize access to one State (the memory store does).
//
//   auto config = sluice::TokenBucketConfig::Create({.rate = {10, sluice::Duration::Seconds(1)},
//   .burst = 20}); sluice::TokenBucketState state;  // a full bucket auto [next, decision] =
//   sluice::Decide(*config, state, now, /*cost=*/1);
#ifndef SLUICE_ALGORITHM_TOKEN_BUCKET_H_
#define SLUICE_ALGORITHM_TOKEN_BUCKET_H_

#include <cstdint>
#include <limits>

#include "absl/status/statusor.h"
#include "sluice/algorithm/bucket_rate.h"
#include "sluice/algorithm/outcome.h"
#include "sluice/rate.h"

namespace sluice {

// Options shared by token_bucket, gcra and leaky_bucket (mode: police).
struct BucketOptions {
  Rate rate;
  // Capacity in cost units. Default (0): rate.limit, one period's worth.
  int64_t burst = 0;
};

// A validated bucket: the rate in ticks and the capacity. Shared by the three
// algorithms that admit the same set of requests (token_bucket, gcra,
// leaky_bucket police), each with its own state encoding.
class BucketConfig {
 public:
  // REQUIRES: a valid rate; 0 <= burst, and burst * ticks_per_token <= 2^61.
  static absl::StatusOr<BucketConfig> Create(const BucketOptions& options);

  const Rate& rate() const { return rate_; }
  const BucketRate& bucket_rate() const { return bucket_rate_; }
  int64_t burst() const { return burst_; }
  int64_t capacity_ticks() const { return capacity_ticks_; }
  // Ticks that drain (or refill) in `us` microseconds, saturating at
  // capacity + 1 so that an idle gap of years cannot overflow.
  int64_t TicksIn(int64_t us) const;

 private:
  Rate rate_;
  BucketRate bucket_rate_;
  int64_t burst_ = 0;
  int64_t capacity_ticks_ = 0;
  int64_t fill_us_ = 0;  // capacity / ticks_per_us + 1: any longer gap refills all
};

struct TokenBucketConfig : BucketConfig {
  static absl::StatusOr<TokenBucketConfig> Create(const BucketOptions& options);
};

struct TokenBucketState {
  static constexpr int64_t kNeverUsed = std::numeric_limits<int64_t>::min();
  int64_t tokens_ticks = 0;
  int64_t last_us = kNeverUsed;  // kNeverUsed: a full bucket
};

Outcome<TokenBucketState> Decide(const TokenBucketConfig& config, TokenBucketState state, Time now,
                                 int64_t cost);
// Gives back `cost` taken at `taken_at` (all-or-nothing across limits).
TokenBucketState Refund(const TokenBucketConfig& config, TokenBucketState state, Time taken_at,
                        int64_t cost);
// Takes `cost` at `now` whether or not it fits: below zero tokens is debt
// (kMaxDebtLimits, outcome.h).
TokenBucketState Charge(const TokenBucketConfig& config, TokenBucketState state, Time now,
                        int64_t cost);
// When the bucket is full again: from then on the state equals a fresh one.
Time FreshAt(const TokenBucketConfig& config, const TokenBucketState& state);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_TOKEN_BUCKET_H_
