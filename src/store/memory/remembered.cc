#include "store/memory/remembered.h"

#include <sys/mman.h>

#include <array>
#include <cstddef>
#include <new>

namespace sluice::internal {
namespace {

constexpr int kTimeBits = 48;
constexpr uint64_t kTimeMask = (uint64_t{1} << kTimeBits) - 1;

uint64_t TimeOf(uint64_t cell) { return cell & kTimeMask; }
uint64_t FingerprintOf(uint64_t cell) { return cell >> kTimeBits; }

// The key's fingerprint: never 0, which marks an empty cell.
uint64_t Fingerprint(uint64_t hash) {
  const uint64_t fp = hash >> kTimeBits;
  return fp == 0 ? 1 : fp;
}

// Milliseconds since the epoch, rounded up (later: never fresher), within
// the cell's 48 bits; 0 for times before the epoch.
uint64_t UntilMs(Time t) {
  const int64_t us = t.unix_micros();
  if (us <= 0) return 0;
  return std::min<uint64_t>(static_cast<uint64_t>((us + 999) / 1000), kTimeMask);
}

uint64_t NowMs(Time now) {
  const int64_t us = now.unix_micros();
  return us <= 0 ? 0 : static_cast<uint64_t>(us / 1000);
}

// Raises `cell` to `until` (a max) while it still holds `fp` (0: any, the
// overflow cell). False when the cell went to another key meanwhile.
bool RaiseTo(std::atomic<uint64_t>& cell, uint64_t fp, uint64_t until) {
  uint64_t seen = cell.load(std::memory_order_relaxed);
  for (;;) {
    if (fp != 0 && FingerprintOf(seen) != fp) return false;
    if (TimeOf(seen) >= until) return true;
    const uint64_t next = (fp != 0 ? fp << kTimeBits : 0) | until;
    if (cell.compare_exchange_weak(seen, next, std::memory_order_release,
                                   std::memory_order_relaxed)) {
      return true;
    }
  }
}

}  // namespace

namespace {

size_t MappedBytes(int64_t cells) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(cells) * sizeof(uint64_t);
  return (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

}  // namespace

// Zeroed pages from the system, committed only as cells are first written:
// the table costs nothing until keys are evicted. Huge pages where the
// system grants them (2 MB each: 24 page faults for max_keys 1,000,000,
// rather than 12,000), so committing the table stalls no decision.
std::atomic<uint64_t>* RememberedKeys::MapTable(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // a hint: refused, it is 4 KB pages
  return static_cast<std::atomic<uint64_t>*>(p);
}

void RememberedKeys::Unmap::operator()(std::atomic<uint64_t>* p) const { munmap(p, bytes); }

RememberedKeys::RememberedKeys(int64_t cells)
    : buckets_(std::max<int64_t>(2, (cells + kBucketCells - 1) / kBucketCells)),
      table_(MapTable(MappedBytes(buckets_ * kBucketCells)),
             Unmap{MappedBytes(buckets_ * kBucketCells)}) {
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
}

// The two buckets a hash may use: two independent parts of it mapped onto
// [0, buckets) by a multiply and a shift (no power of two needed).
std::array<uint64_t, 2> RememberedKeys::BucketsOf(uint64_t hash) const {
  const auto n = static_cast<unsigned __int128>(buckets_);
  const uint64_t second = hash * 0x9E3779B97F4A7C15ULL;
  return {
      static_cast<uint64_t>((static_cast<unsigned __int128>(hash << 16 | hash >> 48) * n) >> 64),
      static_cast<uint64_t>((static_cast<unsigned __int128>(second) * n) >> 64)};
}

void RememberedKeys::Prefault(int64_t pages) {
  constexpr int64_t kPageCells = 4096 / sizeof(uint64_t);
  const int64_t total = cells();
  if (prefaulted_.load(std::memory_order_relaxed) >= total) return;
  const int64_t from = prefaulted_.fetch_add(pages * kPageCells, std::memory_order_relaxed);
  const int64_t to = std::min(total, from + pages * kPageCells);
  // An atomic add of nothing: a write (which commits the page), that
  // changes no cell.
  for (int64_t i = from; i < to; i += kPageCells) {
    table_.get()[i].fetch_add(0, std::memory_order_relaxed);
  }
}

void RememberedKeys::Remember(uint64_t hash, Time fresh_at, Time now) {
  const uint64_t until = UntilMs(fresh_at);
  const uint64_t now_ms = NowMs(now);
  if (until <= now_ms) return;  // fresh by now: nothing to remember
  remembered_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t fp = Fingerprint(hash);
  const std::array<uint64_t, 2> at = BucketsOf(hash);
  std::atomic<uint64_t>* buckets[2] = {Bucket(at[0]), Bucket(at[1])};
  for (int attempt = 0; attempt < 4; ++attempt) {
    // The key's own cell, if it has one: later only.
    for (std::atomic<uint64_t>* b : buckets) {
      for (int i = 1; i < kBucketCells; ++i) {
        const uint64_t c = b[i].load(std::memory_order_relaxed);
        if (FingerprintOf(c) == fp && TimeOf(c) > now_ms && RaiseTo(b[i], fp, until)) {
          used_.store(true, std::memory_order_release);
          return;
        }
      }
    }
    // A free cell (empty, or its time passed) in the emptier bucket.
    int free_count[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      for (int i = 1; i < kBucketCells; ++i) {
        free_count[k] += TimeOf(buckets[k][i].load(std::memory_order_relaxed)) <= now_ms;
      }
    }
    if (free_count[0] == 0 && free_count[1] == 0) break;
    std::atomic<uint64_t>* b = buckets[free_count[1] > free_count[0] ? 1 : 0];
    for (int i = 1; i < kBucketCells; ++i) {
      uint64_t c = b[i].load(std::memory_order_relaxed);
      if (TimeOf(c) > now_ms) continue;
      if (b[i].compare_exchange_strong(c, fp << kTimeBits | until, std::memory_order_release,
                                       std::memory_order_relaxed)) {
        used_.store(true, std::memory_order_release);
        return;
      }
    }
  }
  // Both buckets full of live keys: the first one's overflow, which every
  // key of that bucket then reads.
  RaiseTo(buckets[0][0], 0, until);
  used_.store(true, std::memory_order_release);
}

std::optional<Time> RememberedKeys::RecallSlow(uint64_t hash, Time now) const {
  const uint64_t fp = Fingerprint(hash);
  const std::array<uint64_t, 2> at = BucketsOf(hash);
  const std::atomic<uint64_t>* buckets[2] = {Bucket(at[0]), Bucket(at[1])};
  uint64_t latest = TimeOf(buckets[0][0].load(std::memory_order_acquire));
  for (const std::atomic<uint64_t>* b : buckets) {
    for (int i = 1; i < kBucketCells; ++i) {
      const uint64_t c = b[i].load(std::memory_order_acquire);
      if (FingerprintOf(c) == fp) latest = std::max(latest, TimeOf(c));
    }
  }
  if (latest <= NowMs(now)) return std::nullopt;
  return Time::FromUnixMicros(static_cast<int64_t>(latest) * 1000);
}

}  // namespace sluice::internal
