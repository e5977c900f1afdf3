// The memory store's cell for a sliding log: the log under a byte lock, as
// every state that is not a few words (read_gate.h, StateCell's third form),
// plus its summary (SlidingLogState::Summary) behind a sequence lock, which
// a decision reads without the lock.
//
// Why: every Decide on a log moves its latest time seen, so on one hot key
// every decision wrote under the lock, and two threads denied on one key
// ran at 0.4x of one. Most decisions on a hot key are denials that are
// certain from the summary alone (CertainDenial: the log holds the limit
// and its oldest entry has not left the window); those are answered from
// the summary, and only the time they saw is kept, as an atomic maximum
// that the next locked step folds into the log first. The answers are the
// ones Decide gives: a locked step decides as if the denials it did not
// see came after it, which changes nothing, because until the oldest entry
// leaves no entry is dropped and no request that was denied there fits.
//
// Thread-safety: Update and Peek from any thread inside a reader section of
// the shard's gate; Get and the move only inside a write section.
#ifndef SLUICE_STORE_MEMORY_LOG_CELL_H_
#define SLUICE_STORE_MEMORY_LOG_CELL_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>

#include "sluice/algorithm/window.h"
#include "sluice/decision.h"
#include "store/memory/spin_lock.h"

namespace sluice::internal {

class LogCell {
 public:
  using Summary = SlidingLogState::Summary;

  explicit LogCell(SlidingLogState state) : state_(std::move(state)) { Publish(); }
  // Only inside a write section (a rehash): nobody reads either cell.
  LogCell(LogCell&& other) noexcept
      : version_(other.version_),
        summary_(other.summary_),
        state_(std::move(other.state_)),
        seen_us_(other.seen_us_.load(std::memory_order_relaxed)) {}

  // Runs `step` (Decision(SlidingLogState&)) on the log under its lock,
  // after the times the denials answered from the summary saw.
  template <typename Step>
  Decision Update(Step step) {
    std::lock_guard guard(lock_);
    state_.SeeTime(seen_us_.load(std::memory_order_relaxed));
    Decision d = step(state_);
    Publish();
    return d;
  }

  // The denial `certain` (std::optional<Decision>(const Summary&)) finds in
  // the log's summary, read without the lock; `now_us` is then kept as a
  // time the log has seen. nullopt when it finds none, or while a locked
  // step rewrites the summary.
  template <typename Certain>
  std::optional<Decision> Peek(int64_t now_us, Certain certain) {
    std::atomic_ref<uint32_t> version(version_);
    const uint32_t seen = version.load(std::memory_order_acquire);
    if (seen & 1) return std::nullopt;
    Summary s;
    s.last_us = Load(summary_.last_us);
    s.total = Load(summary_.total);
    s.oldest_us = Load(summary_.oldest_us);
    s.oldest_cost = Load(summary_.oldest_cost);
    s.newest_us = Load(summary_.newest_us);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version.load(std::memory_order_relaxed) != seen) return std::nullopt;
    std::optional<Decision> d = certain(s);
    if (d) {
      int64_t latest = seen_us_.load(std::memory_order_relaxed);
      while (now_us > latest &&
             !seen_us_.compare_exchange_weak(latest, now_us, std::memory_order_relaxed)) {
      }
    }
    return d;
  }

  const SlidingLogState& Get() const { return state_; }

 private:
  static int64_t Load(const int64_t& word) {
    return std::atomic_ref<const int64_t>(word).load(std::memory_order_relaxed);
  }
  static void Store(int64_t& word, int64_t value) {
    std::atomic_ref<int64_t>(word).store(value, std::memory_order_relaxed);
  }

  // Writes the log's summary for Peek; only a locked step (or the owner,
  // before anyone reads) calls it. A summary unchanged is not rewritten.
  void Publish() {
    const Summary next = state_.summary();
    if (next == summary_) return;  // only writers write it: a plain read
    std::atomic_ref<uint32_t> version(version_);
    const uint32_t v = version.load(std::memory_order_relaxed);
    version.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    Store(summary_.last_us, next.last_us);
    Store(summary_.total, next.total);
    Store(summary_.oldest_us, next.oldest_us);
    Store(summary_.oldest_cost, next.oldest_cost);
    Store(summary_.newest_us, next.newest_us);
    version.store(v + 2, std::memory_order_release);
  }

  SpinLock lock_;
  uint32_t version_ = 0;  // odd while Publish rewrites the summary
  Summary summary_;
  SlidingLogState state_;
  // The latest time a Peek's denial saw. Last, after the log: at least 64
  // bytes from the summary, so never on its cache line, which the denials
  // on a hot key share while this word moves every microsecond.
  std::atomic<int64_t> seen_us_{0};
};
static_assert(sizeof(SpinLock) + sizeof(uint32_t) + sizeof(SlidingLogState::Summary) +
                  sizeof(SlidingLogState) >=
              64);

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_LOG_CELL_H_
