#include "sluice/algorithm/token_bucket.h"

#include <algorithm>
#include <utility>

#include "algorithm/bucket_math.h"
#include "base/cat.h"

namespace sluice {

using internal::BucketDecide;
using internal::CeilDiv;

absl::StatusOr<BucketConfig> BucketConfig::Create(const BucketOptions& options) {
  absl::StatusOr<BucketRate> bucket_rate = MakeBucketRate(options.rate);
  if (!bucket_rate.ok()) return bucket_rate.status();
  if (options.burst < 0) {
    return absl::InvalidArgumentError(
        internal::Cat("burst must not be negative, got ", options.burst));
  }
  BucketConfig config;
  config.rate_ = options.rate;
  config.bucket_rate_ = *bucket_rate;
  config.burst_ = options.burst == 0 ? options.rate.limit : options.burst;
  if (config.burst_ > (int64_t{1} << 61) / bucket_rate->ticks_per_token) {
    return absl::InvalidArgumentError(internal::Cat(
        "burst ", config.burst_, " at rate ", FormatRate(options.rate),
        " is too large (burst x period / limit must stay below 2^61 ticks, see bucket_rate.h)"));
  }
  config.capacity_ticks_ = config.burst_ * bucket_rate->ticks_per_token;
  config.fill_us_ = config.capacity_ticks_ / bucket_rate->ticks_per_us + 1;
  return config;
}

int64_t BucketConfig::TicksIn(int64_t us) const {
  if (us <= 0) return 0;
  if (us > fill_us_) return capacity_ticks_ + 1;  // (no division per call)
  return us * bucket_rate_.ticks_per_us;
}

absl::StatusOr<TokenBucketConfig> TokenBucketConfig::Create(const BucketOptions& options) {
  absl::StatusOr<BucketConfig> base = BucketConfig::Create(options);
  if (!base.ok()) return base.status();
  return TokenBucketConfig{*base};
}

namespace {

// The tokens at `now_us` (lazy refill) and the time they are counted at. A
// clock that went back refills nothing and keeps `last`. Tokens below zero
// are debt (Charge), repaid at the rate like any missing token.
std::pair<int64_t, int64_t> Refilled(const TokenBucketConfig& config, const TokenBucketState& state,
                                     int64_t now_us) {
  const int64_t capacity = config.capacity_ticks();
  if (state.last_us == TokenBucketState::kNeverUsed) return {capacity, now_us};
  const int64_t gap = now_us - state.last_us;
  int64_t refill = config.TicksIn(gap);
  if (state.tokens_ticks < 0 && gap > 0) {
    // In debt: up to the whole of it and the capacity (TicksIn stops at one
    // capacity, so that an idle gap of years cannot overflow).
    const int64_t need = capacity - state.tokens_ticks;
    const int64_t per_us = config.bucket_rate().ticks_per_us;
    refill = gap > need / per_us ? need : gap * per_us;
  }
  return {std::min(capacity, state.tokens_ticks + refill), std::max(state.last_us, now_us)};
}

}  // namespace

Outcome<TokenBucketState> Decide(const TokenBucketConfig& config, TokenBucketState state, Time now,
                                 int64_t cost) {
  const int64_t now_us = now.unix_micros();
  const int64_t capacity = config.capacity_ticks();
  const auto [tokens, last] = Refilled(config, state, now_us);
  internal::BucketStep step = BucketDecide(config, capacity - tokens, cost);
  if (step.consumed) state = {capacity - step.used_after, last};
  internal::MeasureFromNow(step.decision, last - now_us);
  return {state, step.decision};
}

TokenBucketState Charge(const TokenBucketConfig& config, TokenBucketState state, Time now,
                        int64_t cost) {
  if (cost <= 0) return state;
  const int64_t capacity = config.capacity_ticks();
  const auto [tokens, last] = Refilled(config, state, now.unix_micros());
  return {capacity - internal::ChargedUsed(config, capacity - tokens, cost), last};
}

TokenBucketState Refund(const TokenBucketConfig& config, TokenBucketState state, Time /*taken_at*/,
                        int64_t cost) {
  if (state.last_us == TokenBucketState::kNeverUsed || cost <= 0) return state;
  const int64_t give = std::min(cost, config.burst()) * config.bucket_rate().ticks_per_token;
  state.tokens_ticks = std::min(config.capacity_ticks(), state.tokens_ticks + give);
  return state;
}

Time FreshAt(const TokenBucketConfig& config, const TokenBucketState& state) {
  if (state.last_us == TokenBucketState::kNeverUsed) return Time::FromUnixMicros(INT64_MIN);
  const int64_t missing = config.capacity_ticks() - state.tokens_ticks;
  return Time::FromUnixMicros(state.last_us + CeilDiv(missing, config.bucket_rate().ticks_per_us));
}

}  // namespace sluice
