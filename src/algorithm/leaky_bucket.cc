#include "sluice/algorithm/leaky_bucket.h"

#include <algorithm>

#include "algorithm/bucket_math.h"
#include "base/cat.h"

namespace sluice {

using internal::CeilDiv;

// ---- police: a meter, the token bucket seen from its empty side ----

absl::StatusOr<LeakyPoliceConfig> LeakyPoliceConfig::Create(const BucketOptions& options) {
  absl::StatusOr<BucketConfig> base = BucketConfig::Create(options);
  if (!base.ok()) return base.status();
  return LeakyPoliceConfig{*base};
}

Outcome<LeakyPoliceState> Decide(const LeakyPoliceConfig& config, LeakyPoliceState state, Time now,
                                 int64_t cost) {
  const int64_t now_us = now.unix_micros();
  // The level leaks while time passes; a clock that went back leaks nothing.
  const int64_t level =
      std::max<int64_t>(0, state.level_ticks - config.TicksIn(now_us - state.last_us));
  internal::BucketStep step = internal::BucketDecide(config, level, cost);
  internal::MeasureFromNow(step.decision, state.last_us - now_us);
  if (step.consumed) state = {step.used_after, std::max(state.last_us, now_us)};
  return {state, step.decision};
}

LeakyPoliceState Refund(const LeakyPoliceConfig& config, LeakyPoliceState state, Time /*taken_at*/,
                        int64_t cost) {
  if (cost <= 0) return state;
  const int64_t give = std::min(cost, config.burst()) * config.bucket_rate().ticks_per_token;
  state.level_ticks = std::max<int64_t>(0, state.level_ticks - give);
  return state;
}

Time FreshAt(const LeakyPoliceConfig& config, const LeakyPoliceState& state) {
  return Time::FromUnixMicros(state.last_us +
                              CeilDiv(state.level_ticks, config.bucket_rate().ticks_per_us));
}

// ---- shape: a queue that hands out departure times ----

absl::StatusOr<LeakyShapeConfig> LeakyShapeConfig::Create(const ShapeOptions& options) {
  absl::StatusOr<BucketRate> bucket_rate = MakeBucketRate(options.rate);
  if (!bucket_rate.ok()) return bucket_rate.status();
  if (options.max_delay < Duration::Zero()) {
    return absl::InvalidArgumentError(
        internal::Cat("max_delay must not be negative, got ", options.max_delay.micros(), "us"));
  }
  if (options.max_delay > kMaxPeriod) {
    return absl::InvalidArgumentError(internal::Cat("max_delay ", FormatDuration(options.max_delay),
                                                    " is longer than the maximum 366d"));
  }
  if (options.queue < 0) {
    return absl::InvalidArgumentError(
        internal::Cat("queue must not be negative, got ", options.queue));
  }
  const int64_t per_us = bucket_rate->ticks_per_us;
  const int64_t per_token = bucket_rate->ticks_per_token;
  // queue * per_token <= 2^60 keeps every sum in Decide (now_ticks + wait +
  // cost ticks, up to 2070 at 2048 ticks/us) below 2^63.
  if (options.queue > (int64_t{1} << 60) / per_token) {
    return absl::InvalidArgumentError(internal::Cat("queue ", options.queue, " is too large"));
  }
  LeakyShapeConfig config;
  config.rate_ = options.rate;
  config.bucket_rate_ = *bucket_rate;
  config.queue_ = options.queue;
  config.max_delay_ = options.max_delay;
  if (options.max_delay == Duration::Zero() && options.queue == 0) {
    config.max_delay_ = options.rate.period;
  }
  // The bound is on the wait of a request's last cost unit.
  int64_t bound = INT64_MAX;
  if (config.max_delay_ > Duration::Zero() || options.queue == 0) {
    bound = config.max_delay_.micros() * per_us;  // <= 366d * 2048: fits
  }
  if (options.queue > 0) bound = std::min(bound, options.queue * per_token);
  config.bound_ticks_ = bound;
  config.capacity_ = bound / per_token + 1;
  return config;
}

Outcome<LeakyShapeState> Decide(const LeakyShapeConfig& config, LeakyShapeState state, Time now,
                                int64_t cost) {
  const int64_t per_us = config.bucket_rate().ticks_per_us;
  const int64_t per_token = config.bucket_rate().ticks_per_token;
  const int64_t bound = config.bound_ticks();
  const int64_t now_ticks = now.unix_micros() * per_us;
  const int64_t start = std::max(state.next_free_ticks, now_ticks);
  const int64_t wait = start - now_ticks;
  Decision d;
  d.limit = config.capacity();
  auto remaining_after = [&](int64_t next_free) -> int64_t {
    const int64_t w = next_free - now_ticks;
    return w > bound ? 0 : (bound - w) / per_token + 1;
  };
  if (cost > config.capacity()) {  // its last unit could never fit in the bound
    d.retry_after = Duration::Infinite();
    d.remaining = remaining_after(start);
    d.reset_after = Duration::Micros(CeilDiv(wait, per_us));
    return {state, d};
  }
  const int64_t last_unit_wait = wait + (cost > 0 ? (cost - 1) * per_token : 0);
  if (last_unit_wait <= bound) {
    d.allowed = true;
    d.delay = Duration::Micros(CeilDiv(wait, per_us));
    if (cost > 0) state.next_free_ticks = start + cost * per_token;
    const int64_t next_free = std::max(state.next_free_ticks, now_ticks);
    d.remaining = remaining_after(next_free);
    d.reset_after = Duration::Micros(CeilDiv(next_free - now_ticks, per_us));
    return {state, d};
  }
  d.remaining = remaining_after(start);
  d.reset_after = Duration::Micros(CeilDiv(wait, per_us));
  d.retry_after = Duration::Micros(CeilDiv(last_unit_wait - bound, per_us));
  return {state, d};
}

LeakyShapeState Refund(const LeakyShapeConfig& /*config*/, LeakyShapeState state, Time /*taken_at*/,
                       int64_t /*cost*/) {
  return state;
}

Time FreshAt(const LeakyShapeConfig& config, const LeakyShapeState& state) {
  return Time::FromUnixMicros(CeilDiv(state.next_free_ticks, config.bucket_rate().ticks_per_us));
}

}  // namespace sluice
