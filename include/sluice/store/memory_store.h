// sluice/store/memory_store.h: state in this process, shared by its threads.
//
// Each limit's table is split into 64 shards, each a flat hash map. A
// decision on a key already held only reads its shard's map, and updates
// the key's state in place by a compare-and-swap (one-word states: gcra,
// token_bucket and leaky_bucket police, kept as their zero time and decided
// as gcra, a fixed_window or sliding_window whose window and counts fit in
// one word, and leaky_bucket shape), a
// sequence lock (other fixed-size states) or a byte
// lock beside the state (the sliding log's timestamps); only inserting and
// erasing keys takes the shard alone. So threads on different keys write no
// shared cache line, and threads denied on one hot key write none at all
// (docs/design.md, "store: where state lives"). Keys of up to 15 bytes are
// stored inline (16 bytes per key); longer keys cost one extra allocation.
//
// Bounded: the store as a whole never holds more than `max_keys` keys across
// all its tables (a slot is reserved before a key is inserted). From 15/16
// of the bound on, the store drops keys whose state is back to fresh (a full
// bucket, empty windows: dropping them changes no decision). Only if that
// frees too little and the store fills does it evict keys that are not
// fresh, those closest to fresh first (stats().forced_evictions; zero in a
// well-sized deployment). What such a key gets when it comes back is
// `on_full`'s choice: by default the store remembers when each evicted key
// would have been fresh, in a fixed table beside the keys, and a returning
// key starts from a state at least as restrictive as the one it lost, so a
// flood of new keys cannot reset an exhausted one (docs/configuration.md,
// "When the memory store is full"). This work is done in small slices
// paid by the inserts, so no decision waits for a pass over all keys (a
// decision spends at most a few slices of ~1,000 keys, well under a
// millisecond, on it).
//
// Thread-safety: all methods, from any number of threads.
//
//   sluice::MemoryStore store({.max_keys = 100'000});
//   auto table = store.OpenTable(limit_config);
#ifndef SLUICE_STORE_MEMORY_STORE_H_
#define SLUICE_STORE_MEMORY_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "sluice/store/store.h"

namespace sluice {

// OnFull (what a full store does when no key is fresh) is in store.h, so
// that the config can name it.
struct MemoryStoreOptions {
  // Most keys held across all tables. Default: 1,000,000. REQUIRES: >= 1.
  int64_t max_keys = 1'000'000;
  OnFull on_full = OnFull::kRemember;
};

// kRemember's table: cells per max_keys slot (48 bytes per slot).
inline constexpr int64_t kRememberedCellsPerKey = 6;

struct MemoryStoreStats {
  int64_t keys = 0;              // keys held now (with the inserts under way)
  int64_t fresh_evictions = 0;   // keys dropped because their state was fresh
  int64_t forced_evictions = 0;  // keys dropped while not fresh (memory ran out)
  int64_t reclaim_passes = 0;    // sweeps started (the store passed 15/16 of max_keys)
  int64_t remembered = 0;        // kRemember: forced evictions remembered
  int64_t recalled = 0;          // kRemember: decisions on new keys from a remembered state
  int64_t denied_new = 0;        // kDenyNew: new keys denied for want of room
  int64_t remembered_bytes = 0;  // kRemember: the table's size, allocated at the first eviction
};

namespace internal {
class KeyBudget;
class RememberedKeys;
struct MemoryStoreTestPeer;
}  // namespace internal

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});
  ~MemoryStore() override;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  absl::StatusOr<std::shared_ptr<LimitTable>> OpenTable(const LimitConfig& config) override;

  MemoryStoreStats stats() const;
  const MemoryStoreOptions& options() const { return options_; }

 private:
  friend struct internal::MemoryStoreTestPeer;
  MemoryStoreOptions options_;
  std::shared_ptr<internal::KeyBudget> budget_;
  std::shared_ptr<internal::RememberedKeys> remembered_;  // kRemember only
  std::atomic<uint64_t> next_salt_{0};                    // tells tables apart in remembered_
};

}  // namespace sluice

#endif  // SLUICE_STORE_MEMORY_STORE_H_
