// sluice/store/store.h: where the state of a limit's keys lives.
//
// A `Store` opens one `LimitTable` per limit; the table maps keys (arbitrary
// byte strings of at most kMaxKeyLength bytes) to that limit's state and
// runs the limit's algorithm on it. The memory store (memory_store.h) keeps
// the state in this process; other stores keep it elsewhere behind the same
// interface.
//
// Thread-safety: every method of Store and LimitTable may be called from any
// number of threads at once.
//
//   sluice::MemoryStore store;
//   auto table = store.OpenTable(*sluice::MakeLimit({.algorithm = sluice::Algorithm::kGcra,
//                                                    .rate = *sluice::ParseRate("10/s")}));
//   absl::StatusOr<sluice::Decision> d = (*table)->Decide("user-1", clock.Now(), 1);
#ifndef SLUICE_STORE_STORE_H_
#define SLUICE_STORE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/decision.h"
#include "sluice/time.h"

namespace sluice {

// What the memory store (memory_store.h) does when it is full and no key
// is fresh: `store.memory.on_full` in the config.
enum class OnFull {
  // Evict the keys closest to fresh, and remember when each would have been
  // fresh, in a table beside the keys (48 bytes per max_keys slot,
  // memory_store.h): a key that comes back starts from the most restrictive
  // state that is fresh then. Never fresher than it left. A new key that
  // shares a remembered key's cells starts restricted too (a false
  // restriction, counted in stats().recalled with the true ones): under
  // 0.1% of new keys while up to 4 x max_keys evicted keys are remembered
  // at once, more beyond.
  kRemember,
  // Evict nothing that is not fresh: a new key that finds no room is denied
  // (retry after a second; stats().denied_new). Nobody's state is lost;
  // new clients wait while the store is full.
  kDenyNew,
  // Evict the keys closest to fresh and forget them: a key that comes back
  // starts fresh. The store never restricts anyone wrongly, and a flood of
  // new keys can reset an exhausted one.
  kEvict,
};

// Longest key a store accepts, in bytes. Longer keys are rejected with
// InvalidArgument, never truncated (two keys must never share a bucket).
inline constexpr size_t kMaxKeyLength = 1024;

// InvalidArgument naming the length and the maximum.
absl::Status KeyTooLongError(size_t size);
// OK, or KeyTooLongError. Inline: every decision of a store checks it.
inline absl::Status ValidateKey(std::string_view key) {
  if (key.size() > kMaxKeyLength) [[unlikely]] {
    return KeyTooLongError(key.size());
  }
  return absl::OkStatus();
}

class LimitTable {
 public:
  virtual ~LimitTable() = default;

  // Runs the limit for `key` at `now`, taking `cost` when allowed.
  // REQUIRES: cost >= 0. Errors: InvalidArgument for a key that is too long;
  // stores with I/O also Unavailable / DeadlineExceeded.
  virtual absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) = 0;

  // What Decide would answer, without taking anything or creating the key.
  // Check(key, now, 0) reads a key's state ("why was I limited").
  virtual absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) = 0;

  // Decide, where a concurrency limit's slots are held in an entry named
  // `slot` (not 0), given back and renewed by that name alone
  // (concurrency.h); other limits decide as Decide.
  virtual absl::StatusOr<Decision> Hold(std::string_view key, Time now, int64_t cost,
                                        uint64_t slot) {
    (void)slot;
    return Decide(key, now, cost);
  }

  // Gives back `cost` that Decide took at `taken_at` (a later limit of the
  // same request denied it: all-or-nothing). `slot`: the name Hold gave a
  // concurrency limit's slots (which alone then go back, if still held); 0
  // for what Decide took.
  virtual absl::Status Refund(std::string_view key, Time taken_at, int64_t cost, uint64_t slot) = 0;

  // Takes `cost` at `now` whether or not it fits (a settled cost above its
  // estimate): what is over the limit is debt (kCharges, kMaxDebtLimits).
  // Unimplemented for an algorithm that carries no debt.
  virtual absl::Status Charge(std::string_view key, Time now, int64_t cost) {
    (void)key, (void)now, (void)cost;
    return absl::UnimplementedError(
        "this limit cannot be charged past what it admits (settled costs: token_bucket, "
        "gcra, fixed_window, sliding_window on the memory store)");
  }

  // Refund(key, taken_at, cost, slot) and then Hold(key, now, cost, slot)
  // as one step, nobody else deciding between them: a concurrency limit's
  // lease extended (its slot is kept, never lost to another request). Slots
  // named `slot` that are no longer held are not taken afresh: denied.
  virtual absl::StatusOr<Decision> Renew(std::string_view key, Time taken_at, Time now,
                                         int64_t cost, uint64_t slot) = 0;

  virtual const LimitConfig& config() const = 0;
};

// What a remote store is asked to do with the limits of one key in one call.
enum class BatchOp {
  kDecide,  // all-or-nothing: take `cost` from every limit only if all allow
  kCheck,   // answer as kDecide would, taking nothing
  kRefund,  // give back `cost` taken at `taken_at` (leaky_bucket shape excepted)
  kRenew,   // kRefund, then kDecide at `now`, as one step (LimitTable::Renew)
  // (kDecide, kRefund and kRenew with a slot: a concurrency limit's slots
  // named by it, as LimitTable::Hold, Refund and Renew.)
  kCharge,  // take `cost` at `now` whether or not it fits (LimitTable::Charge)
};

struct BatchResult {
  // The time the store decided at, by its own clock (Redis' TIME): a refund
  // of what this call took passes it back as `taken_at`.
  Time store_time;
  // One per table, in the order given. Empty for kRefund and kCharge.
  // kRenew: denied anywhere, nothing stays taken anywhere.
  std::vector<Decision> decisions;
};

using BatchCallback = std::function<void(absl::StatusOr<BatchResult>)>;

// A batch on tables in this process, answered at once: kDecide takes from
// every table only if all allow (what one took is given back when a later
// one denies; the tables after a denial are checked, taking nothing).
absl::StatusOr<BatchResult> DecideInProcess(std::span<LimitTable* const> tables,
                                            std::string_view key, BatchOp op, Time now,
                                            int64_t cost, Time taken_at, uint64_t slot = 0);

// A leased limit (docs/distributed.md, "Leased limits"): the instance takes
// a slice of the limit from the shared store in one call, reserved there
// before anything is admitted, and decides requests against it in memory.
struct LeaseOptions {
  // Units a slice asks for; 0 ("auto"): what this instance uses in a tenth
  // of a second (a bucket: in its horizon, an eighth of its burst
  // tolerance within 1 to 100 ms), at least 1. Either way at most an eighth
  // of the limit (a bucket: of its burst); a window's slices also at most
  // half of what it has left, as the store last said, so they shrink to
  // single units as the limit runs out.
  int64_t size = 0;
  // A key's slice unused for this long is given back (a bucket's slots
  // are not: they pass with their time).
  Duration ttl = Duration::Seconds(2);
  friend bool operator==(const LeaseOptions&, const LeaseOptions&) = default;
};

// The limits a lease can slice: fixed_window, and gcra and token_bucket
// with a burst of 2 or more whose burst tolerance ((burst - 1) emission
// intervals) is at least kMinLeaseTolerance; a positive ttl and a size of
// auto (0) or more. InvalidArgument says which and why.
inline constexpr Duration kMinLeaseTolerance = Duration::Millis(10);
absl::Status ValidateLease(const LimitConfig& config, const LeaseOptions& lease);

// A turn of an event loop: what a thread's loop runs of the work it has
// ready before it waits again. A caller on such a loop that asks a remote
// store (DecideBatch) for several decisions in one turn may let the store
// hold them until the turn ends, so that they go out together, in one call
// to Redis, instead of the first alone and the rest after its answer
// (docs/distributed.md, "Decisions asked in one turn"). The caller names its
// loop's turn for the thread while it asks (InTurn). Never around a blocking
// call: the store would hold what the caller then waits for.
class LoopTurn {
 public:
  // Runs `fn` on the calling thread, once its loop has run what it had
  // ready when AtTurnEnd was called.
  virtual void AtTurnEnd(std::function<void()> fn) = 0;

 protected:
  ~LoopTurn() = default;
};

// A LoopTurn for a loop that ends its turns itself: it keeps what
// AtTurnEnd is given and runs it at End. One loop's: not thread-safe.
//
//   sluice::LoopTurnQueue turn;
//   { const sluice::InTurn in_turn(turn); limiter.AcquireAsync(...); ... }
//   turn.End();  // when the loop has nothing more ready
class LoopTurnQueue final : public LoopTurn {
 public:
  void AtTurnEnd(std::function<void()> fn) override { ends_.push_back(std::move(fn)); }
  // How many functions End would run.
  size_t due() const { return ends_.size(); }
  // Runs what AtTurnEnd was given, in order; what they give it meanwhile
  // waits for the next End. Outside every InTurn, as a loop's turn ends.
  void End() {
    running_.swap(ends_);
    for (std::function<void()>& fn : running_) fn();
    running_.clear();
  }

 private:
  std::vector<std::function<void()>> ends_;
  std::vector<std::function<void()>> running_;
};

// Names `turn` the calling thread's loop turn for as long as it lives.
class InTurn {
 public:
  explicit InTurn(LoopTurn& turn) : outer_(current_) { current_ = &turn; }
  ~InTurn() { current_ = outer_; }
  InTurn(const InTurn&) = delete;
  InTurn& operator=(const InTurn&) = delete;

  // The calling thread's turn; null outside every InTurn.
  static LoopTurn* Current() { return current_; }

 private:
  static inline thread_local LoopTurn* current_ = nullptr;
  LoopTurn* const outer_;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::StatusOr<std::shared_ptr<LimitTable>> OpenTable(const LimitConfig& config) = 0;

  // A table whose keys are kept apart from other tables of the same config
  // by `name` (a policy's name). Stores in this process keep every table
  // apart anyway and ignore the name; a shared store (Redis) puts it in its
  // keys, so that instances of a fleet meet in the same state.
  virtual absl::StatusOr<std::shared_ptr<LimitTable>> OpenNamedTable(const LimitConfig& config,
                                                                     std::string_view name) {
    (void)name;
    return OpenTable(config);
  }

  // A named table whose decisions are leased. Stores that cannot lease
  // (every store in this process: there is nothing to save) answer
  // InvalidArgument.
  virtual absl::StatusOr<std::shared_ptr<LimitTable>> OpenLeasedTable(const LimitConfig& config,
                                                                      std::string_view name,
                                                                      const LeaseOptions& lease);

  // Envoy's quota service across instances (docs/envoy.md, "Quota service
  // (RLQS)"): claims for `instance` its share of `bucket`'s limit, `want`
  // at most and never below `floor` (rates in micro-requests per second),
  // valid for `ttl` from the store's now. `done` gets the claim and the
  // instance's fair share (`target`, to shrink to when the claim is above
  // it), once, on a thread of the store's. Stores in this process answer
  // Unimplemented: one instance needs no claim.
  struct QuotaClaim {
    int64_t claim = 0;
    int64_t target = 0;
    Time store_time;
  };
  virtual void ClaimQuota(std::string_view bucket, std::string_view instance, int64_t want,
                          int64_t floor, int64_t limit, Duration ttl,
                          std::function<void(absl::StatusOr<QuotaClaim>)> done);

  // True for stores whose state lives in another process (Redis): their
  // answers take a round trip, so callers use DecideBatch, which answers
  // asynchronously for all the limits of one key at once.
  virtual bool remote() const { return false; }

  // Runs `op` for `key` on `tables` (all opened by this store, a leaky_bucket
  // shape limit last) in one round trip and calls `done` exactly once, on a
  // thread of the store's (or before returning, for an immediate error).
  // Errors: Unavailable (store unreachable, circuit open), DeadlineExceeded
  // (no answer within the store's timeout), InvalidArgument (key too long).
  // A call answered DeadlineExceeded may still run in the store: when its
  // reply comes after all, `late` (if set) is called with it, at most once,
  // on the store's thread; a call whose connection is lost first is never
  // known. The default, for in-process stores, answers inline from
  // Decide/Check/Refund (never late). `slot`: what kDecide holds a
  // concurrency limit's slots under, and kRefund and kRenew give back
  // (LimitTable::Hold); 0 for none.
  virtual void DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op,
                           Time now, int64_t cost, Time taken_at, uint64_t slot, BatchCallback done,
                           BatchCallback late = nullptr);
};

}  // namespace sluice

#endif  // SLUICE_STORE_STORE_H_
