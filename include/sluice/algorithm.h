// sluice/algorithm.h: every algorithm behind one name, one options struct
// and one validated config type.
//
// `LimitOptions` is the flat form a config file or a caller fills in
// (algorithm, rate, burst, mode, max_delay, queue); `MakeLimit` validates it
// once and returns a `LimitConfig`, a variant over the algorithms' own
// configs. Code that stores state (the memory store, the Redis store) visits
// the variant and calls the algorithm's pure Decide.
//
//   absl::StatusOr<sluice::LimitConfig> limit = sluice::MakeLimit(
//       {.algorithm = sluice::Algorithm::kGcra, .rate = *sluice::ParseRate("100/s"), .burst = 20});
#ifndef SLUICE_ALGORITHM_H_
#define SLUICE_ALGORITHM_H_

#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"
#include "sluice/algorithm/concurrency.h"
#include "sluice/algorithm/gcra.h"
#include "sluice/algorithm/leaky_bucket.h"
#include "sluice/algorithm/token_bucket.h"
#include "sluice/algorithm/window.h"

namespace sluice {

enum class Algorithm {
  kTokenBucket,
  kGcra,
  kLeakyBucket,
  kFixedWindow,
  kSlidingLog,
  kSlidingWindow,
  kConcurrency,
};

enum class LeakyMode { kPolice, kShape };

// The config-file names: "token_bucket", "gcra", "leaky_bucket",
// "fixed_window", "sliding_log", "sliding_window", "concurrency".
std::string_view AlgorithmName(Algorithm algorithm);
std::optional<Algorithm> AlgorithmFromName(std::string_view name);

struct LimitOptions {
  Algorithm algorithm = Algorithm::kTokenBucket;
  Rate rate;
  // Bucket algorithms only. Default (0): rate.limit.
  int64_t burst = 0;
  // leaky_bucket only.
  LeakyMode mode = LeakyMode::kPolice;
  Duration max_delay;  // shape; default rate.period when queue is 0 too
  int64_t queue = 0;   // shape; 0: bounded by max_delay only
  // concurrency only: rate.limit is the slots (requests in flight), and
  // rate.period stays zero; a slot not given back is free after lease_ttl
  // (default kDefaultLeaseTtl).
  Duration lease_ttl;

  friend bool operator==(const LimitOptions&, const LimitOptions&) = default;
};

using LimitConfig =
    std::variant<TokenBucketConfig, GcraConfig, LeakyPoliceConfig, LeakyShapeConfig,
                 FixedWindowConfig, SlidingLogConfig, SlidingWindowConfig, ConcurrencyConfig>;

// Validates once; the error names the field and the value.
absl::StatusOr<LimitConfig> MakeLimit(const LimitOptions& options);

// The state each algorithm keeps per key. With LimitConfig above, this is
// where an algorithm is registered.
template <typename Config>
struct StateOf;
template <>
struct StateOf<TokenBucketConfig> {
  using type = TokenBucketState;
};
template <>
struct StateOf<GcraConfig> {
  using type = GcraState;
};
template <>
struct StateOf<LeakyPoliceConfig> {
  using type = LeakyPoliceState;
};
template <>
struct StateOf<LeakyShapeConfig> {
  using type = LeakyShapeState;
};
template <>
struct StateOf<FixedWindowConfig> {
  using type = FixedWindowState;
};
template <>
struct StateOf<SlidingLogConfig> {
  using type = SlidingLogState;
};
template <>
struct StateOf<SlidingWindowConfig> {
  using type = SlidingWindowState;
};
template <>
struct StateOf<ConcurrencyConfig> {
  using type = SlidingLogState;
};
template <typename Config>
using StateOf_t = typename StateOf<Config>::type;

// One calling shape for every algorithm: a key's state decided, checked and
// refunded in place. An algorithm whose state is a small value has a pure
// Decide (decided on a copy, the copy kept); one that updates its state in
// place (the sliding log) brings its own Check.
template <typename Config>
Decision DecideInPlace(const Config& config, StateOf_t<Config>& state, Time now, int64_t cost) {
  if constexpr (requires { Decide(config, state, now, cost).state; }) {
    auto outcome = Decide(config, state, now, cost);
    state = outcome.state;
    return outcome.decision;
  } else {
    return Decide(config, state, now, cost);
  }
}

// What DecideInPlace would answer, taking nothing.
template <typename Config>
Decision CheckInPlace(const Config& config, StateOf_t<Config>& state, Time now, int64_t cost) {
  if constexpr (requires { Check(config, state, now, cost); }) {
    return Check(config, state, now, cost);
  } else {
    return Decide(config, state, now, cost).decision;
  }
}

// Whether the algorithm can charge a cost whether or not it fits (settled
// costs, kMaxDebtLimits): token_bucket, gcra, fixed_window, sliding_window.
template <typename Config>
inline constexpr bool kCharges = requires(const Config& config, StateOf_t<Config> state) {
  { Charge(config, state, Time(), int64_t{0}) } -> std::same_as<StateOf_t<Config>>;
};
bool Charges(const LimitConfig& config);

// Takes `cost` at `now` whether or not it fits; nothing for an algorithm
// that cannot (kCharges).
template <typename Config>
void ChargeInPlace(const Config& config, StateOf_t<Config>& state, Time now, int64_t cost) {
  if constexpr (kCharges<Config>) state = Charge(config, state, now, cost);
}

// Gives back `cost` taken at `taken_at`.
template <typename Config>
void RefundInPlace(const Config& config, StateOf_t<Config>& state, Time taken_at, int64_t cost) {
  if constexpr (std::is_void_v<decltype(Refund(config, state, taken_at, cost))>) {
    Refund(config, state, taken_at, cost);
  } else {
    state = Refund(config, state, taken_at, cost);
  }
}

// What a limit is, in a few words, naming only what differs from the
// defaults: "fixed_window 40/min", "gcra 100/s burst 20",
// "leaky_bucket shape 10/s max_delay 5s".
std::string DescribeLimit(const LimitOptions& limit);

// The rate the limit was configured with, and its algorithm.
const Rate& RateOf(const LimitConfig& config);
Algorithm AlgorithmOf(const LimitConfig& config);
bool IsShape(const LimitConfig& config);
// A concurrency limit: what it took is held until released (Limiter::Release).
bool IsConcurrency(const LimitConfig& config);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_H_
