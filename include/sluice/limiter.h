// sluice/limiter.h: a keyed limiter, the few lines a C++ user writes.
//
// A Limiter is a policy of one or more limits applied to one key. A request
// passes only if every limit passes; when a later limit denies, what the
// earlier ones took is given back (all-or-nothing). The decision reported is
// the most restrictive: when denied, the limit that makes the request wait
// longest (so Retry-After is never early); when allowed, the limit with the
// least remaining. A leaky_bucket shape limit (at most one per policy) is
// decided last, because a departure slot, once given, is not given back.
//
// Thread-safety: Acquire, Check and Refund may be called from any number of
// threads at once. The Limiter reads its clock once per call.
//
//   sluice::MemoryStore store;
//   auto limiter = sluice::Limiter::Create(store, {
//       .name = "api",
//       .limits = {{.algorithm = sluice::Algorithm::kGcra,
//                   .rate = *sluice::ParseRate("100/s"), .burst = 20}}});
//   absl::StatusOr<sluice::PolicyDecision> d = (*limiter)->Acquire("user-42");
//   if (d.ok() && !d->allowed) { /* 429, Retry-After: d->retry_after.CeilSeconds() */ }
#ifndef SLUICE_LIMITER_H_
#define SLUICE_LIMITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/decision.h"
#include "sluice/store/store.h"

namespace sluice {

struct LimiterOptions {
  // Names the policy in errors (and, in the server, in headers and metrics).
  std::string name = "default";
  // At least one. Each is validated by MakeLimit.
  std::vector<LimitOptions> limits;
  // Read once per call. Default: SystemClock::Default(). Must outlive the Limiter.
  const Clock* clock = nullptr;
};

struct AcquireOptions {
  // Weight of the request, >= 0. 0 reads the state without taking anything.
  int64_t cost = 1;
};

// The reported decision, and which limit (index into LimiterOptions::limits)
// it came from.
struct PolicyDecision : Decision {
  size_t limit_index = 0;
};

class Limiter {
 public:
  // Errors: InvalidArgument naming the policy, the limit and the field.
  static absl::StatusOr<std::unique_ptr<Limiter>> Create(Store& store, LimiterOptions options);

  // Decides for `key` now and takes `options.cost` from every limit if all
  // allow it. Errors: InvalidArgument (negative cost, key too long) and
  // whatever the store reports.
  absl::StatusOr<PolicyDecision> Acquire(std::string_view key, AcquireOptions options = {});

  // The same decision at `now`, for callers that read the clock themselves
  // (the server reads it once per request).
  absl::StatusOr<PolicyDecision> AcquireAt(std::string_view key, Time now, int64_t cost);

  // Gives back `cost` taken at `taken_at` by a successful AcquireAt, from
  // every limit (a caller combining several limiters keeps all-or-nothing).
  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost);

  // Each limit's own answer for `key` at `now` to a request of `cost`,
  // taking nothing (cost 0: the state as it is). In LimiterOptions order.
  absl::StatusOr<std::vector<Decision>> Inspect(std::string_view key, Time now, int64_t cost);

  // What Acquire would answer, taking nothing.
  absl::StatusOr<PolicyDecision> Check(std::string_view key, AcquireOptions options = {});

  const std::string& name() const { return name_; }
  const std::vector<LimitConfig>& limits() const { return configs_; }

 private:
  Limiter() = default;

  std::string name_;
  const Clock* clock_ = nullptr;
  std::vector<LimitConfig> configs_;               // in the caller's order
  std::vector<std::shared_ptr<LimitTable>> tables_;  // in the caller's order
  std::vector<size_t> order_;                      // decision order: shape last
};

}  // namespace sluice

#endif  // SLUICE_LIMITER_H_
