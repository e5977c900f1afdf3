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
// Limits may live in different stores: an everyday per-instance limit in
// the memory store and a fleet-wide one in Redis (LimiterOptions::stores).
// The limits in a remote store are decided together in one round trip
// (Store::DecideBatch): AcquireAsync answers when it returns; the blocking
// forms wait for it. When the remote store fails, `on_store_error` decides.
//
// Thread-safety: every method may be called from any number of threads at
// once. The Limiter reads its clock once per call. The blocking forms must
// not be called on a remote store's own I/O thread.
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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/decision.h"
#include "sluice/store/store.h"

namespace sluice {

// What a decision does when a remote store (Redis) cannot answer: the
// store is unreachable, its circuit breaker is open, or it did not answer
// within its timeout.
enum class OnStoreError {
  kAllow,  // the remote limits allow (fail open)
  kDeny,   // the request is denied, Retry-After 1 s (fail closed)
  kLocal,  // the remote limits are decided by in-process limits of the same shape
};

// What a decision does with a key longer than kMaxKeyLength (1024 bytes).
// Keys are often client-chosen (an API key, a bearer token), so such a key is
// never an error that a store failure mode could turn into a pass.
enum class LongKeys {
  // Decided under "sha256:" and the key's SHA-256 in hex (71 bytes): the
  // same on every instance, so a fleet shares it; distinct long keys keep
  // distinct state.
  kHash,
  kRefuse,  // InvalidArgument ("key of N bytes is longer than ..."): a 400
};

struct LimiterOptions {
  // Names the policy in errors (and, in the server, in headers and metrics).
  // A remote store puts it in its keys: limiters of one name share state.
  std::string name = "default";
  // At least one. Each is validated by MakeLimit.
  std::vector<LimitOptions> limits;
  // Where limit i's state lives: stores[i]; when `stores` is empty or
  // stores[i] is null, the store passed to Create. At most one remote store
  // per limiter. Each store must outlive the Limiter.
  std::vector<Store*> stores;
  // Limit i is leased from its store (Store::OpenLeasedTable) when
  // leases[i] is set: only a remote store's limit, and then the only one of
  // the limiter in that store.
  std::vector<std::optional<LeaseOptions>> leases;
  OnStoreError on_store_error = OnStoreError::kAllow;
  LongKeys long_keys = LongKeys::kHash;
  // Read once per call. Default: SystemClock::Default(). Must outlive the
  // Limiter. A CoarseClock (sluice/clock.h) makes the read one load, for
  // decisions up to about a millisecond in the past.
  const Clock* clock = nullptr;
};

struct AcquireOptions {
  // Weight of the request, >= 0. 0 reads the state without taking anything.
  int64_t cost = 1;
};

// The reported decision, and which limit (index into LimiterOptions::limits)
// it came from.
namespace internal {
struct LateCall;  // a remote call that timed out and may still run (limiter.cc)
}  // namespace internal

struct PolicyDecision : Decision {
  size_t limit_index = 0;
  // When the cost was taken, by the Limiter's clock and by the remote
  // store's own clock (Redis' TIME; equal to taken_at without a remote
  // store). Refund(key, decision, cost) passes both back.
  Time taken_at;
  Time store_time;
  // The name its concurrency limits' slots are held under (a random
  // number a decision that holds them draws; 0: none): Release and
  // RenewAsync give back and renew those slots alone, so a decision
  // released twice gives back nothing the second time.
  uint64_t slot = 0;
  // The remote store failed and `on_store_error` made this decision.
  bool store_error = false;
  // Set when the remote call timed out: it may still run in the store, and
  // its late reply is reconciled with this decision (and with a Refund of it).
  std::shared_ptr<internal::LateCall> late;
};

using DecisionCallback = std::function<void(absl::StatusOr<PolicyDecision>)>;
using InspectCallback = std::function<void(absl::StatusOr<std::vector<Decision>>)>;

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

  // AcquireAt that never blocks: `done` is called exactly once, before
  // AcquireAsync returns when every limit is in this process, otherwise on
  // the remote store's thread (keep `done` short, or post it elsewhere).
  void AcquireAsync(std::string_view key, Time now, int64_t cost, DecisionCallback done);
  // Check at `now`, never blocking; `done` as for AcquireAsync.
  void CheckAsync(std::string_view key, Time now, int64_t cost, DecisionCallback done);
  // Inspect, never blocking; `done` as for AcquireAsync.
  void InspectAsync(std::string_view key, Time now, int64_t cost, InspectCallback done);

  // Gives back `cost` that a successful Acquire took, from every limit (a
  // caller combining several limiters keeps all-or-nothing). What remote
  // limits took is given back asynchronously, without waiting.
  absl::Status Refund(std::string_view key, const PolicyDecision& taken, int64_t cost);
  // The same for in-process limits taken at `taken_at` (a concurrency
  // limit's slots counted, not named: the decision's form gives back its
  // own). A limiter with remote limits answers FailedPrecondition: whether
  // and when (by its own clock) the store took is known only from the
  // decision.
  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost);

  // Gives back what `taken` holds of the concurrency limits (their slots),
  // once the request is done; the other limits keep what it took. What a
  // remote store holds is released asynchronously, without waiting. A slot
  // taken while the remote store failed (on_store_error) is not released
  // there: it ends with its lease_ttl. Slots are named (taken.slot): a
  // decision released again gives back nothing.
  absl::Status Release(std::string_view key, const PolicyDecision& taken, int64_t cost);
  // Extends what `taken` holds of the concurrency limits: each gives back
  // its slots and takes them again at `now` in one step, so a held slot is
  // never lost to another request; the other limits are not asked. Allowed:
  // the decision to release or renew next (its lease ends reset_after from
  // now; its slots keep their name). Denied: the slots were no longer held
  // (released, or their lease had run out); nothing is held any more.
  // `done` as for AcquireAsync.
  void RenewAsync(std::string_view key, Time now, const PolicyDecision& taken, int64_t cost,
                  DecisionCallback done);
  // Takes `cost` slots of the concurrency limits alone at `now`, all or
  // nothing (a shaped request, released while it waited out its delay,
  // holds them again). `done` as for RenewAsync.
  void AcquireSlotsAsync(std::string_view key, Time now, int64_t cost, DecisionCallback done);
  // Settles a cost (docs/settled-costs.md): `taken` took `estimate`; the
  // request turned out to cost `actual`. Less: the difference is given back
  // (as Refund); more: it is charged whether or not it fits, and what is
  // over a limit is debt that later requests repay at its rate (Charge).
  // Concurrency limits (slots, not cost) and a shape limit's departure are
  // left alone. FailedPrecondition when a charge is due and some limit
  // cannot carry debt (only token_bucket, gcra, fixed_window and
  // sliding_window can). What a remote store holds is settled
  // asynchronously, without waiting (as Refund).
  absl::Status Settle(std::string_view key, const PolicyDecision& taken, int64_t estimate,
                      int64_t actual);
  // Whether some limit is a concurrency limit (what Release gives back).
  bool holds() const { return holds_; }
  // Whether some concurrency limit holds its slots in the remote store.
  bool holds_remotely() const { return !remote_held_.empty(); }
  // Whether some concurrency limit holds its slots in this process.
  bool holds_here() const { return holds_here_; }

  // True when every limit is in this process: the *Async forms then answer
  // before they return.
  bool in_process() const { return remote_ == nullptr; }

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
  std::vector<LimitConfig> configs_;                 // in the caller's order
  std::vector<std::shared_ptr<LimitTable>> tables_;  // in the caller's order
  std::vector<size_t> order_;                        // decision order: shape last

  // With a remote store: the limits in this process, except a shape limit,
  // are decided first (cheap, and they spare the remote store the requests
  // they deny), then the remote limits in one call, then a local shape limit.
  Store* remote_ = nullptr;
  std::vector<size_t> local_first_;         // indexes, decision order
  std::vector<size_t> remote_limits_;       // indexes, decision order
  std::vector<bool> is_remote_;             // per limit
  std::vector<LimitTable*> remote_tables_;  // the same, as DecideBatch wants them
  std::vector<LimitTable*> remote_held_;    // the remote concurrency limits' tables
  bool holds_ = false;
  bool holds_here_ = false;
  std::optional<size_t> local_shape_;
  OnStoreError on_store_error_ = OnStoreError::kAllow;
  LongKeys long_keys_ = LongKeys::kHash;
  // The key to decide under: `key`, or for a long one its hash (kept in
  // `storage`) or an error.
  absl::StatusOr<std::string_view> FitKey(std::string_view key, std::string& storage) const;
  std::vector<std::shared_ptr<LimitTable>> fallback_;  // kLocal: per limit, null if local

  // RenewAsync (`taken` set) and AcquireSlotsAsync (null).
  void HoldAsync(std::string_view key, Time now, const PolicyDecision* taken, int64_t cost,
                 DecisionCallback done);
  struct Pending;
  void Continue(std::shared_ptr<Pending> p, absl::StatusOr<BatchResult> remote);
  PolicyDecision Merge(const std::vector<std::optional<Decision>>& by_limit) const;
};

}  // namespace sluice

#endif  // SLUICE_LIMITER_H_
