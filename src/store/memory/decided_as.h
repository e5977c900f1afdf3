// The algorithm a memory store table decides a limit with. A token bucket
// and a policing leaky bucket are decided as the gcra of their rate and
// burst: their state kept as one word, their zero time (SPEC: "tokens +
// last time, or one zero time"), updated by one compare-and-swap instead of
// a sequence lock over two words. They decide alike, every field, on every
// monotonic trace (tests/conformance/bucket_test.cc: a meter is the token
// bucket seen from its empty side, and gcra is the token bucket); after a
// clock step back the two-word forms decide as of their last time, the zero
// time as of now: a longer wait, never a shorter one (docs/algorithms.md).
// Internal.
#ifndef SLUICE_STORE_MEMORY_DECIDED_AS_H_
#define SLUICE_STORE_MEMORY_DECIDED_AS_H_

#include "sluice/algorithm.h"

namespace sluice {
namespace internal {

// A policing leaky bucket decided as gcra. Unlike gcra it takes no charge
// (a meter carries no debt: kCharges is false, as for LeakyPoliceConfig),
// so it is gcra's functions but Charge.
struct PoliceAsGcra {
  GcraConfig gcra;
};

inline Outcome<GcraState> Decide(const PoliceAsGcra& config, GcraState state, Time now,
                                 int64_t cost) {
  return Decide(config.gcra, state, now, cost);
}
inline GcraState Refund(const PoliceAsGcra& config, GcraState state, Time taken_at, int64_t cost) {
  return Refund(config.gcra, state, taken_at, cost);
}
inline Time FreshAt(const PoliceAsGcra& config, const GcraState& state) {
  return FreshAt(config.gcra, state);
}

template <typename Config>
const Config& DecidedAs(const Config& config) {
  return config;
}
inline GcraConfig DecidedAs(const TokenBucketConfig& config) {
  return GcraConfig{static_cast<const BucketConfig&>(config)};
}
inline PoliceAsGcra DecidedAs(const LeakyPoliceConfig& config) {
  return {GcraConfig{static_cast<const BucketConfig&>(config)}};
}

}  // namespace internal

template <>
struct StateOf<internal::PoliceAsGcra> {
  using type = GcraState;
};

}  // namespace sluice

#endif  // SLUICE_STORE_MEMORY_DECIDED_AS_H_
