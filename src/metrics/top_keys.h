// TopKeys: the keys counted most over the last few minutes (the keys a
// policy denied most, for the admin listener's /v1/top and the dashboard),
// in fixed memory whatever the keys are.
//
// Space-Saving (Metwally, Agrawal, El Abbadi, "Efficient computation of
// frequent and top-k elements in data streams", 2005) per epoch of
// kEpochSeconds: an epoch tracks at most kCapacity keys; a key not tracked
// when the epoch is full takes the place of the least counted one, starting
// from that count (its `error`). So a key's count is never under its true
// count, and over it by at most its error; any key counted more than
// (epoch total / kCapacity) in an epoch is tracked. The last kEpochs epochs
// are kept and summed when read: the window is between kEpochs - 1 and
// kEpochs epochs long. Memory: kEpochs * kCapacity keys, each as long as
// the policy's keys may be (max_key_bytes).
//
// Thread-safety: all methods from any thread. A thread counts into the
// shard of the CPU it runs on (kShards of them), each with its own lock:
// every denial counts here, and the denials of threads on several CPUs
// neither queue on one lock nor pass one cache line between cores. Top
// sums the shards as it sums epochs (a key missing from a full shard's
// epoch gets that epoch's least count added to its count and its error),
// so the bounds above hold; memory is kShards times the figure above (8:
// where more CPUs count at once, those whose numbers match modulo 8 share a
// shard and its lock; more shards would multiply the memory a flood of
// long keys can take).
//
//   TopKeys top;
//   top.Add("203.0.113.9", now);
//   for (const TopKeys::Entry& e : top.Top(10, now)) ...
#ifndef SLUICE_METRICS_TOP_KEYS_H_
#define SLUICE_METRICS_TOP_KEYS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sluice/time.h"

namespace sluice::metrics {

class TopKeys {
 public:
  static constexpr size_t kCapacity = 256;
  static constexpr size_t kEpochs = 5;
  static constexpr int64_t kEpochSeconds = 60;
  static constexpr size_t kShards = 8;

  struct Entry {
    std::string key;
    int64_t count = 0;  // at least the true count
    int64_t error = 0;  // count - error is at most the true count
  };

  // Counts `n` for `key` at `now`.
  void Add(std::string_view key, Time now, int64_t n = 1);

  // The `n` keys with the highest counts over the epochs still kept at
  // `now`, highest first (ties by key). A key missing from a full epoch
  // might have been counted there up to that epoch's least count: that is
  // added to its count and its error, so the bounds hold over the window.
  std::vector<Entry> Top(size_t n, Time now) const;

 private:
  struct Epoch {
    int64_t index = -1;  // unix seconds / kEpochSeconds; -1: unused
    std::vector<Entry> entries;
    absl::flat_hash_map<std::string, size_t> where;  // key -> index in entries
    // A binary min-heap of indices into entries by count, and each entry's
    // place in it: the least counted key in O(1), a count raised in
    // O(log kCapacity).
    std::vector<uint32_t> heap;
    std::vector<uint32_t> place;

    void Clear();
    void Raised(size_t entry);  // entries[entry].count grew: restore the heap
  };
  static int64_t EpochOf(Time now);
  // The shard of the CPU the calling thread runs on.
  static size_t ShardOfThisThread();

  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::array<Epoch, kEpochs> epochs;
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace sluice::metrics

#endif  // SLUICE_METRICS_TOP_KEYS_H_
