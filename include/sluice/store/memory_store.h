// sluice/store/memory_store.h: state in this process, shared by its threads.
//
// Each limit's table is split into 64 shards, each a flat hash map behind
// its own small lock, so threads working on different keys rarely meet and
// no lock is global. Keys of up to 15 bytes are stored inline (16 bytes per
// key); longer keys cost one extra allocation.
//
// Bounded: the store as a whole never holds more than `max_keys` keys across
// all its tables (a slot is reserved before a key is inserted). From 15/16
// of the bound on, the store drops keys whose state is back to fresh (a full
// bucket, empty windows: dropping them changes no decision). Only if that
// frees too little and the store fills does it evict keys that are not
// fresh, those closest to fresh first; these forced evictions hand the key a
// fresh state, so they are counted (stats().forced_evictions) and should
// stay at zero in a well-sized deployment. This work is done in small slices
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

#include <cstdint>
#include <memory>

#include "sluice/store/store.h"

namespace sluice {

struct MemoryStoreOptions {
  // Most keys held across all tables. Default: 1,000,000. REQUIRES: >= 1.
  int64_t max_keys = 1'000'000;
};

struct MemoryStoreStats {
  int64_t keys = 0;              // keys held now (with the inserts under way)
  int64_t fresh_evictions = 0;   // keys dropped because their state was fresh
  int64_t forced_evictions = 0;  // keys dropped while not fresh (memory ran out)
  int64_t reclaim_passes = 0;    // sweeps started (the store passed 15/16 of max_keys)
};

namespace internal {
class KeyBudget;
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
};

}  // namespace sluice

#endif  // SLUICE_STORE_MEMORY_STORE_H_
