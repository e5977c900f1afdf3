// KeyBudget: the memory store's bound on keys, shared by all its tables, and
// the sweep that makes room under it. Internal.
//
// The bound is exact: a slot is reserved (Reserve, one compare-and-swap)
// before a key is inserted and given back (Removed) after a key is erased,
// so the slot count, which never passes max_keys, is never below the keys
// held, however many threads insert at once.
//
// Room is made in slices, never in one long pass: a sweep walks every table,
// shard by shard, at most kSliceVisits keys per slice and one shard write section at a
// time, resuming where it stopped. The inserts pay for it:
//   1. Once the store passes 15/16 of max_keys, a walk over every key starts.
//      It drops the fresh keys it meets (dropping them changes no decision)
//      and samples the FreshAt times of those it keeps. Until it ends, every
//      insert owes it a few visits, paced so that it ends before the inserts
//      can have filled the store (the old pass's first step, in slices).
//   2. If that left the store above 15/16, memory truly runs out: when the
//      store is full, the sweep goes on evicting the keys closest to fresh
//      (FreshAt at or before a quantile of the sample; forced evictions),
//      paced by the inserts and by each decision that finds the store full,
//      until the store is back at 15/16 (the old pass's second step).
// A decision that finds the store full runs at most kMaxSlicesPerDecision
// slices. Should that free no slot for it (other threads took the slots it
// freed; never seen in the tests), its new key is decided but not kept, and
// that counts as a forced eviction. Which keys a slice drops is one rule
// (SweepRule): the choice of victims can change without touching the pacing.
#ifndef SLUICE_STORE_MEMORY_KEY_BUDGET_H_
#define SLUICE_STORE_MEMORY_KEY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/store/memory_store.h"
#include "sluice/time.h"

namespace sluice::internal {

// The bound on the eviction work of one decision. A slice examines at most
// kSliceVisits keys: one FreshAt each, and an erase for those dropped, about
// 15 ns per key in a release build on a 2-core machine (a slice of 1,024
// keys: ~15 us), so a shard is held alone, and a decision delayed by a slice,
// for tens of microseconds. An insert pays at most one slice; a decision
// that finds the store full runs at most kMaxSlicesPerDecision and may first
// wait for the slices other threads are running (one each). So no decision spends more than
// about 0.1 ms on eviction, whatever max_keys is; 1,024 keeps the lock round
// trips (and the lookup that resumes a walk inside a shard) a small share.
inline constexpr int64_t kSliceVisits = 1024;
inline constexpr int kMaxSlicesPerDecision = 4;

// Which keys a slice drops: those whose FreshAt is at or before
// `drop_at_or_before_us`. Those not fresh at `now` count as forced.
// Evicting, keys of tables whose remembered form loses nothing (the bucket
// algorithms: OnFull::kRemember brings their state back whole) go first:
// theirs is the wider `lossless_at_or_before_us`.
struct SweepRule {
  Time now;
  int64_t drop_at_or_before_us = 0;
  int64_t lossless_at_or_before_us = 0;
};

// Where the sweep is inside one table: a shard (kShards when the table is
// done) and, inside it, the last key the sweep kept (it resumes after it).
struct SweepCursor {
  int shard = 0;
  bool has_resume = false;
  std::string resume;
};

struct SweepProgress {
  int64_t visits = 0;   // keys examined, plus one per shard entered
  int64_t dropped = 0;  // keys erased
  int64_t forced = 0;   // of those, not fresh at rule.now
  int shards_done = 0;  // shards walked to their end
};

// The FreshAt times of every `stride`-th key the sweep keeps, the latest
// kSampleSize of them: the eviction threshold is a quantile of these.
class FreshAtSample {
 public:
  static constexpr size_t kSampleSize = 1024;
  void Reset(int64_t keys);
  void Offer(int64_t fresh_at_us) {
    if (--countdown_ > 0) return;
    countdown_ = stride_;
    if (values_.size() < kSampleSize) {
      values_.push_back(fresh_at_us);
    } else {
      values_[next_++ % kSampleSize] = fresh_at_us;
    }
  }
  // The value below which about `fraction` of the sample lies; INT64_MAX
  // when the sample is empty.
  int64_t Quantile(double fraction) const;

 private:
  int64_t stride_ = 1;
  int64_t countdown_ = 1;
  size_t next_ = 0;
  std::vector<int64_t> values_;
};

// What the budget needs from a table to make room.
class ReclaimableTable {
 public:
  static constexpr int kShards = 64;
  virtual ~ReclaimableTable() = default;
  // Walks from `cursor`, dropping the keys `rule` selects and offering the
  // kept ones to `sample`, until `max_visits` visits, `max_drops` drops or
  // the end of the table (cursor.shard == kShards). Holds one shard alone at
  // a time, for at most `max_visits` keys.
  virtual SweepProgress Sweep(SweepCursor& cursor, const SweepRule& rule, int64_t max_visits,
                              int64_t max_drops, FreshAtSample& sample) = 0;
  // For tests: with every shard locked (Freeze) the table's keys cannot
  // change; KeysWhileFrozen counts them; Thaw unlocks.
  virtual void Freeze() = 0;
  virtual int64_t KeysWhileFrozen() const = 0;
  virtual void Thaw() = 0;
};

class KeyBudget {
 public:
  // `evicts`: whether the store may evict keys that are not fresh (false
  // for OnFull::kDenyNew: a full store sweeps for fresh keys only).
  // `remembers`: OnFull::kRemember, where evicting a bucket algorithm's key
  // loses nothing (SweepRule::lossless_at_or_before_us).
  explicit KeyBudget(int64_t max_keys, bool evicts = true, bool remembers = false);

  enum class Admission {
    kFull,              // no slot: call MakeRoom
    kAdmitted,          // a slot is reserved
    kAdmittedSweepDue,  // a slot is reserved; once the key is in and no shard
                        // lock is held, call PaySweep
  };
  // Reserves a slot for a new key (one compare-and-swap).
  Admission Reserve() {
    int64_t keys = keys_.load(std::memory_order_relaxed);
    do {
      if (keys >= max_keys_) return Admission::kFull;
    } while (!keys_.compare_exchange_weak(keys, keys + 1, std::memory_order_relaxed));
    // Past 15/16 the insert owes the sweep; so does every insert while a
    // fresh sweep runs, which then ends quickly, as one walk over every key.
    if (keys + 1 > low_keys_ || phase_.load(std::memory_order_relaxed) == Phase::kFresh) {
      return Admission::kAdmittedSweepDue;
    }
    return Admission::kAdmitted;
  }
  // Gives back slots: keys erased, or a reservation not used.
  void Removed(int64_t n) { keys_.fetch_sub(n, std::memory_order_relaxed); }
  // The keys held (and slots reserved) in every table, as of a moment ago.
  int64_t keys() const { return keys_.load(std::memory_order_relaxed); }

  // After kAdmittedSweepDue: adds this insert's share of sweep work and does
  // it when enough is owed (at most one slice). Call outside any shard section.
  void PaySweep(Time now);
  // The store is full: runs up to kMaxSlicesPerDecision slices. Returns true
  // with a slot reserved, or false (then the caller keeps nothing and calls
  // NotKept). Call outside any shard section.
  bool MakeRoom(Time now);
  // A new key that was decided but not kept for want of a slot.
  void NotKept() { forced_evictions_.fetch_add(1, std::memory_order_relaxed); }
  // kDenyNew: a new key denied for want of a slot.
  void DeniedNew() { denied_new_.fetch_add(1, std::memory_order_relaxed); }
  bool evicts() const { return evicts_; }

  void Register(ReclaimableTable* table);
  void Unregister(ReclaimableTable* table);

  MemoryStoreStats stats() const;

  // For tests: the keys held by all tables at one instant (every shard
  // locked), and the slot count read at that instant.
  struct HeldKeys {
    int64_t held = 0;
    int64_t slots = 0;
  };
  HeldKeys CountHeldKeys();

 private:
  enum class Phase : uint8_t {
    kIdle,      // below 15/16, or room made
    kFresh,     // sweeping for fresh keys, paced by inserts
    kArmed,     // swept once, too little fresh: evict if the store fills
    kEvicting,  // the store filled: evicting closest to fresh down to 15/16
  };

  void StartSweepLocked(int64_t keys);
  void StartEvictingLocked(Time now);
  // The eviction threshold found too little: a larger share of the sample.
  void WidenEvictionLocked();
  // One slice of at most `visits` visits, as the phase says. Requires mu_.
  void SliceLocked(Time now, int64_t visits);
  bool TryReserveLocked() { return Reserve() != Admission::kFull; }

  const int64_t max_keys_;
  const int64_t low_keys_;  // 15/16 of max_keys_: the sweep starts above it
  const bool evicts_;
  const bool remembers_;

  // Written on every insert; alone on its line.
  alignas(64) std::atomic<int64_t> keys_{0};
  std::atomic<int64_t> sweep_debt_{0};  // visits owed by inserts past 15/16
  alignas(64) std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<int64_t> pace_{1};  // visits each insert owes in this sweep

  std::atomic<int64_t> fresh_evictions_{0};
  std::atomic<int64_t> forced_evictions_{0};
  std::atomic<int64_t> reclaim_passes_{0};
  std::atomic<int64_t> denied_new_{0};

  std::mutex mu_;  // guards what follows; held through a slice
  std::vector<ReclaimableTable*> tables_;
  size_t table_ = 0;                   // the table the sweep is in
  SweepCursor cursor_;                 // where in that table
  int64_t shards_left_ = 0;            // of this phase's walk over every shard
  int64_t threshold_us_ = 0;           // kEvicting: evict keys fresh at or before this
  int64_t lossless_threshold_us_ = 0;  // the same for keys remembered whole: a wider share
  double evict_fraction_ = 0;
  int64_t armed_at_us_ = INT64_MIN / 2;  // when the last walk for fresh keys ended
  FreshAtSample sample_;
};

// For tests: the budget behind a store.
struct MemoryStoreTestPeer {
  static KeyBudget& Budget(MemoryStore& store) { return *store.budget_; }
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_KEY_BUDGET_H_
