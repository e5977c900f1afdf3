#include "store/memory/key_budget.h"

#include <algorithm>

namespace sluice::internal {

void KeyBudget::Register(ReclaimableTable* table) {
  std::lock_guard lock(tables_mu_);
  tables_.push_back(table);
}

void KeyBudget::Unregister(ReclaimableTable* table) {
  std::lock_guard lock(tables_mu_);
  std::erase(tables_, table);
}

void KeyBudget::Reclaim(Time now) {
  std::unique_lock reclaiming(reclaim_mu_, std::try_to_lock);
  if (!reclaiming.owns_lock()) return;  // another thread is making room
  const int64_t keys = keys_.load(std::memory_order_relaxed);
  if (keys < max_keys_) return;
  reclaim_passes_.fetch_add(1, std::memory_order_relaxed);
  // Free 1/16 of the budget per pass, so that a pass, which walks every key,
  // is paid for by max_keys/16 inserts.
  const int64_t want = keys - (max_keys_ - std::max<int64_t>(1, max_keys_ / 16));

  std::lock_guard lock(tables_mu_);
  // 1. Keys whose state is fresh: dropping them changes no decision.
  int64_t freed = 0;
  for (ReclaimableTable* table : tables_) freed += table->DropFresh(now);
  fresh_evictions_.fetch_add(freed, std::memory_order_relaxed);
  if (freed >= want) return;

  // 2. Not enough: memory truly ran out. Evict those closest to fresh, with
  // the threshold taken from a sample so the pass stays one walk.
  std::vector<int64_t> sample;
  for (ReclaimableTable* table : tables_) table->SampleFreshAt(sample, 8);
  int64_t forced = 0;
  int64_t evicted = 0;
  if (!sample.empty()) {
    std::sort(sample.begin(), sample.end());
    const int64_t remaining_keys = std::max<int64_t>(1, keys - freed);
    const size_t k = std::clamp<size_t>(
        static_cast<size_t>((want - freed) * static_cast<int64_t>(sample.size()) / remaining_keys),
        1, sample.size());
    const int64_t threshold = sample[k - 1];
    for (ReclaimableTable* table : tables_) {
      if (freed + evicted >= want) break;
      evicted += table->DropFreshBefore(now, threshold, want - freed - evicted, forced);
    }
  }
  // 3. Ties at the threshold can leave us short: take any key.
  for (ReclaimableTable* table : tables_) {
    if (freed + evicted >= want) break;
    evicted += table->DropFreshBefore(now, INT64_MAX, want - freed - evicted, forced);
  }
  forced_evictions_.fetch_add(forced, std::memory_order_relaxed);
  fresh_evictions_.fetch_add(evicted - forced, std::memory_order_relaxed);
}

MemoryStoreStats KeyBudget::stats() const {
  return {keys_.load(std::memory_order_relaxed), fresh_evictions_.load(std::memory_order_relaxed),
          forced_evictions_.load(std::memory_order_relaxed),
          reclaim_passes_.load(std::memory_order_relaxed)};
}

}  // namespace sluice::internal
