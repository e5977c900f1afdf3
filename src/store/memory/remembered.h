// What the memory store remembers of keys it had to evict while they were
// not fresh, so that a flood of new keys cannot hand an exhausted key a
// fresh state (MemoryStoreOptions::on_full, kRemember). Internal.
//
// RememberedKeys is a fixed table of 8-byte cells: a 16-bit fingerprint of
// the key (and of its table) and the time, in milliseconds rounded up, at
// which the key's state would have been fresh. A key is placed in the
// emptier of two buckets of 8 cells (the first cell of each bucket is its
// overflow); when both are full of live entries, its time goes into the
// overflow cell of the first, which then applies to every key of that
// bucket that is not found. Every write keeps the later time (a max), and a
// lookup takes the latest time of the cells that may be the key's. So a key
// is never remembered as fresh earlier than it was: a shared fingerprint or
// an overflow can only make another key look restricted (a false
// restriction), never the key itself freer. Cells whose time has passed are
// free again.
//
// StateUntil turns a remembered time back into a state: the most
// restrictive state of the algorithm that is fresh at that time. For the
// bucket algorithms (token_bucket, gcra, leaky_bucket) that is the key's own
// state (their state is one time, in effect); for the windows and the log it
// is "used up until then", at least as restrictive as what the key had.
//
// Thread-safety: all methods from any thread; cells are atomics, written by
// compare-and-swap. The table's pages are zeroed by the system and committed
// as they are first written.
#ifndef SLUICE_STORE_MEMORY_REMEMBERED_H_
#define SLUICE_STORE_MEMORY_REMEMBERED_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>

#include "sluice/algorithm.h"
#include "sluice/time.h"

namespace sluice::internal {

class RememberedKeys {
 public:
  static constexpr int kBucketCells = 8;  // cell 0: the bucket's overflow
  // `cells`: the table's size (rounded up to whole buckets).
  explicit RememberedKeys(int64_t cells);

  // `hash`: a 64-bit hash of the table and the key. `fresh_at`: when the
  // key's state would have been fresh.
  void Remember(uint64_t hash, Time fresh_at, Time now);
  // When the key may be fresh again at the latest: a time after `now`, or
  // nullopt when nothing remembered applies. Costs one relaxed load while
  // nothing was ever remembered.
  std::optional<Time> Recall(uint64_t hash, Time now) const {
    if (!used_.load(std::memory_order_acquire)) return std::nullopt;
    return RecallSlow(hash, now);
  }

  // Commits the next `pages` pages of the table (a write to each), so
  // that the first evictions do not each stop on a page fault: the store's
  // sweep calls it with every slice, from the time the store nears full.
  void Prefault(int64_t pages);

  // Decisions on new keys that started from a remembered state.
  void CountRecalled() { recalled_.fetch_add(1, std::memory_order_relaxed); }
  int64_t remembered() const { return remembered_.load(std::memory_order_relaxed); }
  int64_t recalled() const { return recalled_.load(std::memory_order_relaxed); }

  int64_t cells() const { return buckets_ * kBucketCells; }
  int64_t bytes() const { return cells() * static_cast<int64_t>(sizeof(uint64_t)); }
  // bytes() once something was remembered (the table's pages are
  // committed as they are written), else 0.
  int64_t allocated_bytes() const { return used_.load(std::memory_order_acquire) ? bytes() : 0; }

 private:
  std::optional<Time> RecallSlow(uint64_t hash, Time now) const;
  std::array<uint64_t, 2> BucketsOf(uint64_t hash) const;
  std::atomic<uint64_t>* Bucket(uint64_t index) const {
    return table_.get() + index * kBucketCells;
  }
  // The table's memory: its own anonymous mapping (MapTable), unmapped
  // with the table.
  struct Unmap {
    size_t bytes;
    void operator()(std::atomic<uint64_t>* p) const;
  };
  static std::atomic<uint64_t>* MapTable(size_t bytes);

  const int64_t buckets_;
  std::atomic<bool> used_{false};  // something was remembered
  std::atomic<int64_t> remembered_{0};
  std::atomic<int64_t> recalled_{0};
  std::atomic<int64_t> prefaulted_{0};  // cells committed, from the start
  const std::unique_ptr<std::atomic<uint64_t>, Unmap> table_;
};

// The most restrictive state of `config`'s algorithm that is fresh at
// `fresh_at`, as of `now` (< fresh_at).
template <typename Config>
StateOf_t<Config> StateUntil(const Config& config, Time fresh_at, Time now) {
  const int64_t at_us = fresh_at.unix_micros();
  const int64_t now_us = now.unix_micros();
  if constexpr (std::is_same_v<Config, GcraConfig>) {
    return GcraState{.tat_ticks = at_us * config.bucket_rate().ticks_per_us};
  } else if constexpr (std::is_same_v<Config, TokenBucketConfig>) {
    // As of now, missing what refills by fresh_at (below zero: a debt).
    const int64_t missing = (at_us - now_us) * config.bucket_rate().ticks_per_us;
    return TokenBucketState{.tokens_ticks = config.capacity_ticks() - missing, .last_us = now_us};
  } else if constexpr (requires { config.gcra; }) {
    // A policing leaky bucket decided as gcra (decided_as.h).
    return StateUntil(config.gcra, fresh_at, now);
  } else if constexpr (std::is_same_v<Config, LeakyPoliceConfig>) {
    return LeakyPoliceState{.level_ticks = (at_us - now_us) * config.bucket_rate().ticks_per_us,
                            .last_us = now_us};
  } else if constexpr (std::is_same_v<Config, LeakyShapeConfig>) {
    return LeakyShapeState{.next_free_ticks = at_us * config.bucket_rate().ticks_per_us};
  } else if constexpr (std::is_same_v<Config, FixedWindowConfig>) {
    // The window that ends at or after fresh_at, full.
    const int64_t period = config.period().micros();
    return FixedWindowState{.window = (at_us + period - 1) / period - 1, .count = config.limit()};
  } else if constexpr (std::is_same_v<Config, SlidingWindowConfig>) {
    // Both windows full, the later one ending at or after fresh_at minus a
    // period (a sliding window is fresh a period after its last window).
    const int64_t period = config.period().micros();
    return SlidingWindowState{.window = (at_us + period - 1) / period - 2,
                              .prev = config.limit(),
                              .curr = config.limit()};
  } else {
    // The sliding log (and concurrency): the whole limit taken a period
    // before fresh_at.
    SlidingLogState state;
    const int64_t at = at_us - config.period().micros();
    state.Push(at, config.limit(), config.limit());
    state.SeeTime(at);
    return state;
  }
}

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_REMEMBERED_H_
