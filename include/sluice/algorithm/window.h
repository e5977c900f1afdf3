// sluice/algorithm/window.h: the three window algorithms.
//
// fixed_window: at most `limit` cost per calendar-aligned window (windows
//   start at multiples of `period` since the Unix epoch). Two windows'
//   worth (2 x limit) can pass inside one period-long interval that straddles
//   a boundary: that is the algorithm, and the docs show it. State: window
//   index + count.
// sliding_window: the weighted two-window estimate
//   prev * (1 - elapsed/period) + curr must stay within `limit`. Constant
//   memory; approximates sliding_log (the error is measured in the tests and
//   docs/algorithms.md). State: window index + both counts.
// sliding_log: exact. At most `limit` cost in EVERY half-open interval of
//   length `period`. State: the admitted requests of the last period,
//   (time, cost) pairs, bounded by `limit` entries. This is the one state
//   that is not a fixed-size value: Decide updates it in place, because
//   copying a log of up to `limit` entries per decision is the cost the
//   other algorithms avoid.
//
// Time going backwards grants nothing: sliding_log decides as of the latest
// time seen; fixed_window and sliding_window stay in the latest window they
// admitted into, and sliding_window then counts the previous window in full
// (stricter than deciding at the latest time).
//
// Pure functions; callers serialize access to one state.
//
//   auto config = sluice::FixedWindowConfig::Create({.rate = *sluice::ParseRate("40/min")});
//   auto [next, d] = sluice::Decide(*config, sluice::FixedWindowState{}, now, 1);
#ifndef SLUICE_ALGORITHM_WINDOW_H_
#define SLUICE_ALGORITHM_WINDOW_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "sluice/algorithm/outcome.h"
#include "sluice/rate.h"

namespace sluice {

struct WindowOptions {
  Rate rate;  // `limit` cost per `period`
};

class WindowConfig {
 public:
  static absl::StatusOr<WindowConfig> Create(const WindowOptions& options);
  int64_t limit() const { return rate_.limit; }
  Duration period() const { return rate_.period; }
  const Rate& rate() const { return rate_; }

 private:
  Rate rate_;
};

// ---- fixed_window ----
struct FixedWindowConfig : WindowConfig {
  static absl::StatusOr<FixedWindowConfig> Create(const WindowOptions& options);
};

struct FixedWindowState {
  int64_t window = 0;  // floor(now / period) of the window `count` belongs to
  int64_t count = 0;
};

Outcome<FixedWindowState> Decide(const FixedWindowConfig& config, FixedWindowState state, Time now,
                                 int64_t cost);
FixedWindowState Refund(const FixedWindowConfig& config, FixedWindowState state, Time taken_at,
                        int64_t cost);
// Takes `cost` at `now` whether or not it fits: a count over the limit is
// debt, carried into the next windows and repaid at the limit per window
// (kMaxDebtLimits, outcome.h).
FixedWindowState Charge(const FixedWindowConfig& config, FixedWindowState state, Time now,
                        int64_t cost);
Time FreshAt(const FixedWindowConfig& config, const FixedWindowState& state);

// ---- sliding_window ----
struct SlidingWindowConfig : WindowConfig {
  static absl::StatusOr<SlidingWindowConfig> Create(const WindowOptions& options);
};

struct SlidingWindowState {
  int64_t window = 0;  // index of the current window
  int64_t prev = 0;    // cost admitted in window - 1
  int64_t curr = 0;    // cost admitted in window
};

Outcome<SlidingWindowState> Decide(const SlidingWindowConfig& config, SlidingWindowState state,
                                   Time now, int64_t cost);
SlidingWindowState Refund(const SlidingWindowConfig& config, SlidingWindowState state,
                          Time taken_at, int64_t cost);
// Takes `cost` at `now` whether or not it fits: a current count over the
// limit is debt, carried into the next windows (at most one limit of it
// behind each) and repaid at the limit per window (kMaxDebtLimits).
SlidingWindowState Charge(const SlidingWindowConfig& config, SlidingWindowState state, Time now,
                          int64_t cost);
Time FreshAt(const SlidingWindowConfig& config, const SlidingWindowState& state);

// ---- sliding_log ----
// The log keeps at most `limit` entries, so its memory is bounded by the
// limit; a config whose limit exceeds this is rejected.
inline constexpr int64_t kMaxSlidingLogLimit = 1'000'000;

struct SlidingLogConfig : WindowConfig {
  static absl::StatusOr<SlidingLogConfig> Create(const WindowOptions& options);
};

// A ring of (time, cost) entries in time order, growing on demand up to
// `limit` entries. Movable, not copyable (it owns its buffer). A
// concurrency limit's entries also carry the name of the slots they hold
// (concurrency.h), in a ring beside the entries made at the first name (a
// sliding log has none); a named entry joins no other.
class SlidingLogState {
 public:
  struct Entry {
    int64_t time_us;
    int64_t cost;
  };

  SlidingLogState() = default;
  SlidingLogState(SlidingLogState&&) noexcept = default;
  SlidingLogState& operator=(SlidingLogState&&) noexcept = default;

  int64_t size() const { return size_; }
  int64_t total_cost() const { return total_; }
  const Entry& at(int64_t i) const { return ring_[(head_ + i) & (capacity_ - 1)]; }
  // Entry i's name; 0: unnamed (requests of its instant join it).
  uint64_t name_at(int64_t i) const {
    return names_ != nullptr ? names_[(head_ + i) & (capacity_ - 1)] : 0;
  }
  int64_t last_time_us() const { return last_us_; }
  // Bytes held outside the object.
  int64_t heap_bytes() const {
    return capacity_ * static_cast<int64_t>(sizeof(Entry) + (names_ != nullptr ? 8 : 0));
  }

  // Mutators used by Decide and Refund.
  void DropOlderThan(int64_t cutoff_us);  // drops entries with time <= cutoff
  // An entry of `cost` at `time_us` (at or after the newest's), named
  // `name` (0: joining the newest entry when that is of the same instant
  // and unnamed).
  void Push(int64_t time_us, int64_t cost, int64_t max_entries, uint64_t name = 0);
  // Takes `cost` back from the entry a request made at `time_us` joined.
  void RemoveCost(int64_t time_us, int64_t cost);
  // Erases the entry named `name` at or after `time_us`: whether there was one.
  bool RemoveNamed(int64_t time_us, uint64_t name);
  void SeeTime(int64_t now_us) {
    if (now_us > last_us_) last_us_ = now_us;
  }

  // The log without the entries between its oldest and its newest: what
  // CertainDenial decides from.
  struct Summary {
    int64_t last_us = 0;    // the latest time seen
    int64_t total = 0;      // the cost of the entries; the rest is 0 when 0
    int64_t oldest_us = 0;  // the oldest entry's time, and its cost
    int64_t oldest_cost = 0;
    int64_t newest_us = 0;  // the newest entry's time
    bool operator==(const Summary&) const = default;
  };
  Summary summary() const;

 private:
  void EraseAt(int64_t i);  // O(entries)
  void FreeIfEmpty();       // an idle key gives its buffers back

  std::unique_ptr<Entry[]> ring_;
  std::unique_ptr<uint64_t[]> names_;  // null until an entry is named
  int64_t capacity_ = 0;               // a power of two (or 0)
  int64_t head_ = 0;
  int64_t size_ = 0;
  int64_t total_ = 0;
  int64_t last_us_ = 0;  // the latest time seen: the log's "now" never goes back
};

// Updates `state` in place (see the header comment for why).
Decision Decide(const SlidingLogConfig& config, SlidingLogState& state, Time now, int64_t cost);
// Decide's answer, taking nothing: it decides and gives back (cheaper than a
// copy of the log); only the latest time seen moves, as Decide's would.
Decision Check(const SlidingLogConfig& config, SlidingLogState& state, Time now, int64_t cost);
void Refund(const SlidingLogConfig& config, SlidingLogState& state, Time taken_at, int64_t cost);
Time FreshAt(const SlidingLogConfig& config, const SlidingLogState& state);
// The denial Decide(config, state, now, cost) answers, read from the log's
// summary alone, when it is certain: no entry leaves the window by
// max(now, the latest time seen), the request does not fit, and it would
// once the oldest entry leaves. Decide would then change nothing but the
// latest time seen (SeeTime(now)). Otherwise nullopt: ask Decide. For a
// store whose readers see the summary without the log's lock.
std::optional<Decision> CertainDenial(const SlidingLogConfig& config,
                                      const SlidingLogState::Summary& summary, Time now,
                                      int64_t cost);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_WINDOW_H_
