#include "sluice/algorithm/gcra.h"

#include <algorithm>

#include "algorithm/bucket_math.h"

namespace sluice {

absl::StatusOr<GcraConfig> GcraConfig::Create(const BucketOptions& options) {
  absl::StatusOr<BucketConfig> base = BucketConfig::Create(options);
  if (!base.ok()) return base.status();
  return GcraConfig{*base};
}

Outcome<GcraState> Decide(const GcraConfig& config, GcraState state, Time now, int64_t cost) {
  // now_us * ticks_per_us fits: ticks_per_us <= 2048 (bucket_rate.h).
  const int64_t now_ticks = now.unix_micros() * config.bucket_rate().ticks_per_us;
  const int64_t used = state.tat_ticks > now_ticks ? state.tat_ticks - now_ticks : 0;
  const internal::BucketStep step = internal::BucketDecide(config, used, cost);
  if (step.consumed) state.tat_ticks = now_ticks + step.used_after;
  return {state, step.decision};
}

GcraState Charge(const GcraConfig& config, GcraState state, Time now, int64_t cost) {
  if (cost <= 0) return state;
  const int64_t now_ticks = now.unix_micros() * config.bucket_rate().ticks_per_us;
  const int64_t used = state.tat_ticks > now_ticks ? state.tat_ticks - now_ticks : 0;
  state.tat_ticks = now_ticks + internal::ChargedUsed(config, used, cost);
  return state;
}

GcraState Refund(const GcraConfig& config, GcraState state, Time /*taken_at*/, int64_t cost) {
  if (cost <= 0) return state;
  state.tat_ticks -= std::min(cost, config.burst()) * config.bucket_rate().ticks_per_token;
  return state;
}

Time FreshAt(const GcraConfig& config, const GcraState& state) {
  return Time::FromUnixMicros(
      internal::CeilDiv(state.tat_ticks, config.bucket_rate().ticks_per_us));
}

}  // namespace sluice
