#include <algorithm>

#include "base/cat.h"
#include "sluice/algorithm/concurrency.h"
#include "sluice/algorithm/window.h"

namespace sluice {

absl::StatusOr<SlidingLogConfig> SlidingLogConfig::Create(const WindowOptions& options) {
  absl::StatusOr<WindowConfig> base = WindowConfig::Create(options);
  if (!base.ok()) return base.status();
  if (options.rate.limit > kMaxSlidingLogLimit) {
    return absl::InvalidArgumentError(internal::Cat(
        "sliding_log keeps one entry per admitted request, so its limit is capped at ",
        kMaxSlidingLogLimit, " (got ", options.rate.limit,
        "); use sliding_window for larger limits"));
  }
  return SlidingLogConfig{*base};
}

void SlidingLogState::DropOlderThan(int64_t cutoff_us) {
  while (size_ > 0 && ring_[head_].time_us <= cutoff_us) {
    total_ -= ring_[head_].cost;
    head_ = (head_ + 1) & (capacity_ - 1);
    --size_;
  }
  FreeIfEmpty();
}

void SlidingLogState::FreeIfEmpty() {
  if (size_ != 0) return;
  // An idle key gives its buffers back: memory follows activity.
  ring_.reset();
  names_.reset();
  capacity_ = head_ = 0;
}

void SlidingLogState::Push(int64_t time_us, int64_t cost, int64_t max_entries, uint64_t name) {
  if (size_ > 0 && name == 0 && name_at(size_ - 1) == 0) {
    Entry& back = ring_[(head_ + size_ - 1) & (capacity_ - 1)];
    if (back.time_us == time_us) {  // same instant: one entry
      back.cost += cost;
      total_ += cost;
      return;
    }
  }
  if (size_ == capacity_) {
    // Grow by doubling; entries never exceed max_entries (each costs >= 1 and
    // the total stays within the limit), so neither does the buffer, rounded
    // up to a power of two.
    int64_t grown = capacity_ == 0 ? 4 : capacity_ * 2;
    while (grown / 2 >= max_entries && grown > 4) grown /= 2;
    auto ring = std::make_unique<Entry[]>(grown);
    for (int64_t i = 0; i < size_; ++i) ring[i] = at(i);
    if (names_ != nullptr) {
      auto names = std::make_unique<uint64_t[]>(grown);  // zeroed
      for (int64_t i = 0; i < size_; ++i) names[i] = name_at(i);
      names_ = std::move(names);
    }
    ring_ = std::move(ring);
    capacity_ = grown;
    head_ = 0;
  }
  if (name != 0 && names_ == nullptr) names_ = std::make_unique<uint64_t[]>(capacity_);
  const int64_t slot = (head_ + size_) & (capacity_ - 1);
  ring_[slot] = {time_us, cost};
  if (names_ != nullptr) names_[slot] = name;
  ++size_;
  total_ += cost;
}

void SlidingLogState::EraseAt(int64_t i) {
  for (int64_t j = i; j + 1 < size_; ++j) {
    ring_[(head_ + j) & (capacity_ - 1)] = ring_[(head_ + j + 1) & (capacity_ - 1)];
    if (names_ != nullptr) {
      names_[(head_ + j) & (capacity_ - 1)] = names_[(head_ + j + 1) & (capacity_ - 1)];
    }
  }
  --size_;
}

void SlidingLogState::RemoveCost(int64_t time_us, int64_t cost) {
  // The oldest entry at or after `time_us` is the one the refunded request
  // was merged into: entries before it are older, entries after it came later.
  int64_t i = 0;
  while (i < size_ && at(i).time_us < time_us) ++i;
  while (cost > 0 && i < size_) {
    Entry& entry = ring_[(head_ + i) & (capacity_ - 1)];
    const int64_t take = std::min(cost, entry.cost);
    entry.cost -= take;
    total_ -= take;
    cost -= take;
    if (entry.cost > 0) return;
    EraseAt(i);  // rare
  }
}

bool SlidingLogState::RemoveNamed(int64_t time_us, uint64_t name) {
  int64_t lo = 0, hi = size_;  // the first entry at or after time_us (times never decrease)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (at(mid).time_us < time_us) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  while (lo < size_ && name_at(lo) != name) ++lo;
  if (lo == size_) return false;
  total_ -= at(lo).cost;
  EraseAt(lo);
  FreeIfEmpty();
  return true;
}

namespace {

// The sliding log's decision; a concurrency limit's entry named `name`
// (0: unnamed).
Decision DecideLog(const SlidingLogConfig& config, SlidingLogState& state, Time now, int64_t cost,
                   uint64_t name) {
  const int64_t period = config.period().micros();
  const int64_t limit = config.limit();
  // Decide as of the latest time seen, so a clock that went back grants nothing.
  state.SeeTime(now.unix_micros());
  const int64_t at = state.last_time_us();
  state.DropOlderThan(at - period);  // the window is (at - period, at]
  Decision d;
  d.limit = limit;
  if (cost > limit) {
    d.retry_after = Duration::Infinite();
  } else if (state.total_cost() + cost <= limit) {
    d.allowed = true;
    if (cost > 0) state.Push(at, cost, limit, name);
  } else {
    // The request fits once enough of the oldest entries have left the window.
    int64_t freed = 0;
    for (int64_t i = 0; i < state.size(); ++i) {
      freed += state.at(i).cost;
      if (state.total_cost() - freed + cost <= limit) {
        d.retry_after = Duration::Micros(state.at(i).time_us + period - now.unix_micros());
        break;
      }
    }
  }
  d.remaining = limit - state.total_cost();
  if (state.size() > 0) {
    const int64_t newest = state.at(state.size() - 1).time_us;
    d.reset_after = Duration::Micros(newest + period - now.unix_micros());
  }
  return d;
}

}  // namespace

Decision Decide(const SlidingLogConfig& config, SlidingLogState& state, Time now, int64_t cost) {
  return DecideLog(config, state, now, cost, /*name=*/0);
}

Decision Hold(const ConcurrencyConfig& config, SlidingLogState& state, Time now, int64_t cost,
              uint64_t slot) {
  return DecideLog(config, state, now, cost, slot);
}

bool Release(const ConcurrencyConfig& config, SlidingLogState& state, Time taken_at,
             uint64_t slot) {
  // A lease that has ended holds nothing any more, though its entry may not
  // have been dropped yet.
  if (taken_at.unix_micros() <= state.last_time_us() - config.period().micros()) return false;
  return state.RemoveNamed(taken_at.unix_micros(), slot);
}

Decision Renew(const ConcurrencyConfig& config, SlidingLogState& state, Time taken_at, Time now,
               int64_t cost, uint64_t slot) {
  if (!Release(config, state, taken_at, slot)) {
    Decision lost = Check(config, state, now, cost);
    lost.allowed = false;
    return lost;
  }
  return Hold(config, state, now, cost, slot);
}

Decision Check(const SlidingLogConfig& config, SlidingLogState& state, Time now, int64_t cost) {
  const Decision d = Decide(config, state, now, cost);
  if (d.allowed && cost > 0) {
    Refund(config, state, Time::FromUnixMicros(state.last_time_us()), cost);
  }
  return d;
}

void Refund(const SlidingLogConfig& config, SlidingLogState& state, Time taken_at, int64_t cost) {
  // A request that has left the window holds no place in the log any more:
  // the entry at or after `taken_at` would be another request's.
  if (taken_at.unix_micros() <= state.last_time_us() - config.period().micros()) return;
  state.RemoveCost(taken_at.unix_micros(), cost);
}

SlidingLogState::Summary SlidingLogState::summary() const {
  Summary s{.last_us = last_us_, .total = total_};
  if (size_ > 0) {
    s.oldest_us = at(0).time_us;
    s.oldest_cost = at(0).cost;
    s.newest_us = at(size_ - 1).time_us;
  }
  return s;
}

std::optional<Decision> CertainDenial(const SlidingLogConfig& config,
                                      const SlidingLogState::Summary& summary, Time now,
                                      int64_t cost) {
  const int64_t period = config.period().micros();
  const int64_t limit = config.limit();
  const int64_t now_us = now.unix_micros();
  if (summary.total == 0 || cost <= 0 || cost > limit) return std::nullopt;
  // Decide's window is (at - period, at], at = max(now, last seen): the
  // oldest entry is still in it, so nothing is dropped.
  if (std::max(now_us, summary.last_us) >= summary.oldest_us + period) return std::nullopt;
  // Denied, and the first entry Decide's scan frees is the oldest.
  if (summary.total + cost <= limit || summary.total - summary.oldest_cost + cost > limit) {
    return std::nullopt;
  }
  Decision d;
  d.limit = limit;
  d.remaining = limit - summary.total;
  d.retry_after = Duration::Micros(summary.oldest_us + period - now_us);
  d.reset_after = Duration::Micros(summary.newest_us + period - now_us);
  return d;
}

Time FreshAt(const SlidingLogConfig& config, const SlidingLogState& state) {
  if (state.size() == 0) return Time::FromUnixMicros(INT64_MIN);
  return Time::FromUnixMicros(state.at(state.size() - 1).time_us + config.period().micros());
}

}  // namespace sluice
