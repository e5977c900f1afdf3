// KeyBudget: the memory store's bound on keys, shared by all its tables.
// Internal.
#ifndef SLUICE_STORE_MEMORY_KEY_BUDGET_H_
#define SLUICE_STORE_MEMORY_KEY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "sluice/store/memory_store.h"
#include "sluice/time.h"

namespace sluice::internal {

// What the budget needs from a table to make room.
class ReclaimableTable {
 public:
  virtual ~ReclaimableTable() = default;
  // Drops every key whose state is fresh at `now`; returns how many.
  virtual int64_t DropFresh(Time now) = 0;
  // Appends up to `per_shard` FreshAt times (microseconds) from each shard.
  virtual void SampleFreshAt(std::vector<int64_t>& out, int per_shard) = 0;
  // Drops keys fresh at or before `threshold_us` until `want` are gone;
  // returns how many, and adds to `forced` those not fresh at `now`.
  virtual int64_t DropFreshBefore(Time now, int64_t threshold_us, int64_t want,
                                  int64_t& forced) = 0;
};

class KeyBudget {
 public:
  explicit KeyBudget(int64_t max_keys) : max_keys_(max_keys) {}

  bool Full() const { return keys_.load(std::memory_order_relaxed) >= max_keys_; }
  void Added() { keys_.fetch_add(1, std::memory_order_relaxed); }
  void Removed(int64_t n) { keys_.fetch_sub(n, std::memory_order_relaxed); }

  void Register(ReclaimableTable* table);
  void Unregister(ReclaimableTable* table);

  // Makes room for new keys: see memory_store.h for the policy. Returns at
  // once if another thread is already reclaiming.
  void Reclaim(Time now);

  MemoryStoreStats stats() const;

 private:
  const int64_t max_keys_;
  std::atomic<int64_t> keys_{0};
  std::atomic<int64_t> fresh_evictions_{0};
  std::atomic<int64_t> forced_evictions_{0};
  std::atomic<int64_t> reclaim_passes_{0};
  std::mutex reclaim_mu_;
  std::mutex tables_mu_;  // guards tables_; held through a reclaim pass
  std::vector<ReclaimableTable*> tables_;
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_KEY_BUDGET_H_
