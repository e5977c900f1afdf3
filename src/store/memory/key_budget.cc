#include "store/memory/key_budget.h"

#include <algorithm>
#include <cmath>

namespace sluice::internal {
namespace {

// The inserts that owe the sweep add their visits to a debt, paid by
// whichever insert brings it to this many: one lock round trip per chunk of
// visits, not per insert.
constexpr int64_t kPayChunk = 256;

}  // namespace

void FreshAtSample::Reset(int64_t keys) {
  stride_ = std::max<int64_t>(1, keys / static_cast<int64_t>(kSampleSize));
  countdown_ = stride_;
  next_ = 0;
  values_.clear();
}

int64_t FreshAtSample::Quantile(double fraction) const {
  if (values_.empty()) return INT64_MAX;
  std::vector<int64_t> sorted = values_;
  const auto n = static_cast<double>(sorted.size());
  const auto k = static_cast<size_t>(std::clamp(std::ceil(fraction * n), 1.0, n)) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(k), sorted.end());
  return sorted[k];
}

KeyBudget::KeyBudget(int64_t max_keys, bool evicts, bool remembers)
    : max_keys_(max_keys),
      low_keys_(max_keys - std::max<int64_t>(1, max_keys / 16)),
      evicts_(evicts),
      remembers_(remembers) {}

void KeyBudget::Register(ReclaimableTable* table) {
  std::lock_guard lock(mu_);
  tables_.push_back(table);
}

void KeyBudget::Unregister(ReclaimableTable* table) {
  std::lock_guard lock(mu_);
  const auto it = std::find(tables_.begin(), tables_.end(), table);
  if (it == tables_.end()) return;
  const auto index = static_cast<size_t>(it - tables_.begin());
  tables_.erase(it);
  if (index < table_) {
    --table_;
  } else if (index == table_) {
    cursor_.shard = 0;  // the next table, from its start
    cursor_.has_resume = false;
  }
}

void KeyBudget::PaySweep(Time now) {
  const Phase phase = phase_.load(std::memory_order_relaxed);
  if (phase == Phase::kArmed) return;  // nothing to do unless the store fills
  if (phase == Phase::kIdle) {
    std::lock_guard lock(mu_);
    if (phase_.load(std::memory_order_relaxed) == Phase::kIdle && keys() > low_keys_) {
      StartSweepLocked(keys());
    }
    return;
  }
  const int64_t pace = pace_.load(std::memory_order_relaxed);
  if (sweep_debt_.fetch_add(pace, std::memory_order_relaxed) + pace < kPayChunk) return;
  std::lock_guard lock(mu_);
  int64_t visits = sweep_debt_.exchange(0, std::memory_order_relaxed);
  if (visits <= 0) return;  // paid meanwhile
  if (visits > kSliceVisits) {
    sweep_debt_.fetch_add(visits - kSliceVisits, std::memory_order_relaxed);
    visits = kSliceVisits;
  }
  SliceLocked(now, visits);
}

bool KeyBudget::MakeRoom(Time now) {
  std::lock_guard lock(mu_);
  for (int slice = 0; slice < kMaxSlicesPerDecision; ++slice) {
    if (TryReserveLocked()) return true;
    switch (phase_.load(std::memory_order_relaxed)) {
      case Phase::kIdle:
        StartSweepLocked(keys());
        break;
      case Phase::kArmed:
        // Evict what is closest to fresh; or, where nothing but fresh keys
        // may go, walk for fresh keys again (some may be fresh by now).
        // (At most one such walk a second: between them a full store
        // answers at once.)
        if (evicts_) {
          StartEvictingLocked(now);
        } else if (now.unix_micros() - armed_at_us_ >= 1'000'000) {
          StartSweepLocked(keys());
        } else {
          return TryReserveLocked();
        }
        break;
      case Phase::kFresh:
      case Phase::kEvicting:
        break;
    }
    SliceLocked(now, kSliceVisits);
  }
  return TryReserveLocked();
}

void KeyBudget::StartSweepLocked(int64_t keys) {
  phase_.store(Phase::kFresh, std::memory_order_relaxed);
  reclaim_passes_.fetch_add(1, std::memory_order_relaxed);
  const auto shards = static_cast<int64_t>(ReclaimableTable::kShards * tables_.size());
  shards_left_ = shards;
  cursor_.has_resume = false;  // walk the current shard whole, from its start
  sample_.Reset(keys);
  // Pacing: the inserts from 15/16 to full owe twice the walk (every key and
  // every shard), so it ends halfway, before the store can be full.
  const int64_t zone = max_keys_ - low_keys_;
  pace_.store(std::clamp<int64_t>((2 * (keys + shards) + zone - 1) / zone, 1, kSliceVisits),
              std::memory_order_relaxed);
  sweep_debt_.store(0, std::memory_order_relaxed);
}

void KeyBudget::StartEvictingLocked(Time now) {
  phase_.store(Phase::kEvicting, std::memory_order_relaxed);
  // The candidates are the keys closest to fresh, a quarter more of them than
  // the excess over 15/16 (the sample is only a sample). Inserts go on
  // meanwhile, so the walk is paced four times faster than the fresh sweep:
  // each insert then frees several keys, and the store is back at 15/16
  // before the walk has used up the candidates (it stops there).
  const int64_t keys_now = std::max<int64_t>(1, keys());
  evict_fraction_ =
      std::clamp(1.25 * static_cast<double>(keys_now - low_keys_) / static_cast<double>(keys_now),
                 1.0 / FreshAtSample::kSampleSize, 1.0);
  threshold_us_ = std::max(now.unix_micros(), sample_.Quantile(evict_fraction_));
  // Remembered, a bucket algorithm's key loses nothing: any of them may go
  // first, however far from fresh.
  lossless_threshold_us_ = remembers_ ? INT64_MAX : threshold_us_;
  shards_left_ = static_cast<int64_t>(ReclaimableTable::kShards * tables_.size());
  pace_.store(std::min(kSliceVisits, 4 * pace_.load(std::memory_order_relaxed)),
              std::memory_order_relaxed);
  sweep_debt_.store(0, std::memory_order_relaxed);
}

void KeyBudget::WidenEvictionLocked() {
  evict_fraction_ = std::min(1.0, 2 * evict_fraction_);
  threshold_us_ = evict_fraction_ >= 1.0
                      ? INT64_MAX
                      : std::max(threshold_us_, sample_.Quantile(evict_fraction_));
  lossless_threshold_us_ = remembers_ ? INT64_MAX : threshold_us_;
}

void KeyBudget::SliceLocked(Time now, int64_t visits) {
  const Phase phase = phase_.load(std::memory_order_relaxed);
  if (phase != Phase::kFresh && phase != Phase::kEvicting) return;
  if (tables_.empty()) return;
  const bool evicting = phase == Phase::kEvicting;
  SweepRule rule{
      .now = now,
      .drop_at_or_before_us =
          evicting ? std::max(now.unix_micros(), threshold_us_) : now.unix_micros(),
      .lossless_at_or_before_us =
          evicting ? std::max(now.unix_micros(), lossless_threshold_us_) : now.unix_micros()};
  int64_t visited = 0;
  int64_t dropped = 0;
  int64_t forced = 0;
  Phase next = phase;
  while (visits > 0) {
    int64_t max_drops = INT64_MAX;
    if (evicting) {
      max_drops = keys() - low_keys_;
      if (max_drops <= 0) break;
    }
    if (table_ >= tables_.size()) {
      table_ = 0;
      cursor_.shard = 0;
      cursor_.has_resume = false;
    }
    const SweepProgress p = tables_[table_]->Sweep(cursor_, rule, visits, max_drops, sample_);
    visits -= p.visits;
    visited += p.visits;
    dropped += p.dropped;
    forced += p.forced;
    Removed(p.dropped);
    shards_left_ -= p.shards_done;
    if (cursor_.shard >= ReclaimableTable::kShards) {
      ++table_;
      cursor_.shard = 0;
      cursor_.has_resume = false;
    }
    if (shards_left_ > 0) continue;
    // A whole walk over every shard is done.
    if (!evicting) {
      // Every key has been looked at and the fresh ones dropped. If that was
      // not enough, memory truly runs out: evict, but only once the store is
      // full.
      next = keys() > low_keys_ ? Phase::kArmed : Phase::kIdle;
      armed_at_us_ = now.unix_micros();
      break;
    }
    // Evicting, and a whole walk found too few keys at or before the
    // threshold (the sample was off, or ties): widen it and walk again.
    WidenEvictionLocked();
    rule.drop_at_or_before_us = std::max(now.unix_micros(), threshold_us_);
    rule.lossless_at_or_before_us = std::max(now.unix_micros(), lossless_threshold_us_);
    shards_left_ = static_cast<int64_t>(ReclaimableTable::kShards * tables_.size());
  }
  if (evicting) {
    if (keys() <= low_keys_) {
      next = Phase::kIdle;
    } else if (dropped == 0 && visited >= kSliceVisits / 4) {
      // A quarter slice with nothing at or before the threshold, where about
      // one key in 16 should be: the threshold is stale (the sampled keys
      // were used since). Take it from the latest sample, wider.
      WidenEvictionLocked();
    }
  }
  phase_.store(next, std::memory_order_relaxed);
  forced_evictions_.fetch_add(forced, std::memory_order_relaxed);
  fresh_evictions_.fetch_add(dropped - forced, std::memory_order_relaxed);
}

KeyBudget::HeldKeys KeyBudget::CountHeldKeys() {
  std::lock_guard lock(mu_);
  for (ReclaimableTable* table : tables_) table->Freeze();
  HeldKeys count{.held = 0, .slots = keys()};
  for (ReclaimableTable* table : tables_) count.held += table->KeysWhileFrozen();
  for (ReclaimableTable* table : tables_) table->Thaw();
  return count;
}

MemoryStoreStats KeyBudget::stats() const {
  return {.keys = keys_.load(std::memory_order_relaxed),
          .fresh_evictions = fresh_evictions_.load(std::memory_order_relaxed),
          .forced_evictions = forced_evictions_.load(std::memory_order_relaxed),
          .reclaim_passes = reclaim_passes_.load(std::memory_order_relaxed),
          .denied_new = denied_new_.load(std::memory_order_relaxed)};
}

}  // namespace sluice::internal
