#include "metrics/top_keys.h"

#include <sched.h>
#include <algorithm>

#include "absl/strings/string_view.h"

namespace sluice::metrics {
namespace {

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace

void TopKeys::Epoch::Clear() {
  entries.clear();
  where.clear();
  heap.clear();
  place.clear();
}

void TopKeys::Epoch::Raised(size_t entry) {
  size_t at = place[entry];
  for (;;) {
    size_t least = at;
    for (size_t child : {2 * at + 1, 2 * at + 2}) {
      if (child < heap.size() && entries[heap[child]].count < entries[heap[least]].count) {
        least = child;
      }
    }
    if (least == at) return;
    std::swap(heap[at], heap[least]);
    place[heap[at]] = static_cast<uint32_t>(at);
    place[heap[least]] = static_cast<uint32_t>(least);
    at = least;
  }
}

int64_t TopKeys::EpochOf(Time now) {
  const int64_t us = now.unix_micros();
  const int64_t span = kEpochSeconds * 1'000'000;
  return us >= 0 ? us / span : -((-us + span - 1) / span);
}

size_t TopKeys::ShardOfThisThread() {
  // The CPU the thread runs on (glibc reads it from the thread's rseq area,
  // no system call): threads that count at the same time run on different
  // CPUs, so they count in different shards, however many threads there
  // are and in whatever order they came. A thread moved meanwhile only
  // shares a lock.
  const int cpu = sched_getcpu();
  return cpu < 0 ? 0 : static_cast<size_t>(cpu) % kShards;
}

void TopKeys::Add(std::string_view key, Time now, int64_t n) {
  if (n <= 0) return;
  const int64_t index = EpochOf(now);
  Shard& shard = shards_[ShardOfThisThread()];
  std::lock_guard lock(shard.mu);
  const auto epochs = static_cast<int64_t>(kEpochs);
  Epoch& e = shard.epochs[static_cast<size_t>((index % epochs + epochs) % epochs)];
  if (e.index != index) {
    // An epoch of kEpochs ago (or never used, or a clock gone back): reuse.
    e.index = index;
    e.Clear();
  }
  if (auto it = e.where.find(Absl(key)); it != e.where.end()) {
    e.entries[it->second].count += n;
    e.Raised(it->second);
    return;
  }
  if (e.entries.size() < kCapacity) {
    // Its count is the least of all (so far), or ties: the heap's end is
    // its place until it is raised.
    const size_t entry = e.entries.size();
    e.where.emplace(std::string(key), entry);
    e.entries.push_back({std::string(key), n, 0});
    e.place.push_back(static_cast<uint32_t>(e.heap.size()));
    e.heap.push_back(static_cast<uint32_t>(entry));
    // Sift up: it may count less than its parents.
    for (size_t at = e.heap.size() - 1; at > 0;) {
      const size_t parent = (at - 1) / 2;
      if (e.entries[e.heap[parent]].count <= e.entries[e.heap[at]].count) break;
      std::swap(e.heap[at], e.heap[parent]);
      e.place[e.heap[at]] = static_cast<uint32_t>(at);
      e.place[e.heap[parent]] = static_cast<uint32_t>(parent);
      at = parent;
    }
    return;
  }
  // Full: the least counted key gives its place, and its count, to this one.
  const size_t least = e.heap.front();
  Entry& slot = e.entries[least];
  e.where.erase(slot.key);
  slot.error = slot.count;
  slot.count += n;
  slot.key.assign(key);
  e.where.emplace(slot.key, least);
  e.Raised(least);
}

std::vector<TopKeys::Entry> TopKeys::Top(size_t n, Time now) const {
  const int64_t newest = EpochOf(now);
  // A key's sums over the live epochs of every shard; `counted_least`: the
  // least counts of the full epochs that hold it. A key missing from a full
  // epoch might have been counted there up to that epoch's least count, so
  // each key gets, on top of its sums, the least counts of the full epochs
  // that do not hold it: all of them (`all_least`) less its own.
  struct Sum {
    int64_t count = 0, error = 0, counted_least = 0;
  };
  absl::flat_hash_map<std::string, Sum> sums;
  int64_t all_least = 0;
  // One shard held at a time (Add holds one), each only while it is read.
  for (const Shard& shard : shards_) {
    std::lock_guard lock(shard.mu);
    for (const Epoch& e : shard.epochs) {
      if (e.index < 0 || e.index > newest || e.index <= newest - static_cast<int64_t>(kEpochs)) {
        continue;
      }
      // Not full: a key missing from it had no count there.
      const int64_t least = e.entries.size() < kCapacity ? 0 : e.entries[e.heap.front()].count;
      all_least += least;
      for (const Entry& entry : e.entries) {
        Sum& sum = sums[entry.key];
        sum.count += entry.count;
        sum.error += entry.error;
        sum.counted_least += least;
      }
    }
  }
  std::vector<Entry> out;
  out.reserve(sums.size());
  for (auto& [key, sum] : sums) {
    const int64_t missed = all_least - sum.counted_least;
    out.push_back({key, sum.count + missed, sum.error + missed});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.count != b.count ? a.count > b.count : a.key < b.key;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

}  // namespace sluice::metrics
