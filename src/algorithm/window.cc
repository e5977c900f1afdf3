// fixed_window and sliding_window, and the config they share.
#include "sluice/algorithm/window.h"

#include <algorithm>

#include "algorithm/bucket_math.h"
#include "base/cat.h"

namespace sluice {

using internal::CeilDiv;
using internal::FloorDiv;

absl::StatusOr<WindowConfig> WindowConfig::Create(const WindowOptions& options) {
  if (absl::Status s = ValidateRate(options.rate); !s.ok()) return s;
  WindowConfig config;
  config.rate_ = options.rate;
  return config;
}

absl::StatusOr<FixedWindowConfig> FixedWindowConfig::Create(const WindowOptions& options) {
  absl::StatusOr<WindowConfig> base = WindowConfig::Create(options);
  if (!base.ok()) return base.status();
  return FixedWindowConfig{*base};
}

absl::StatusOr<SlidingWindowConfig> SlidingWindowConfig::Create(const WindowOptions& options) {
  absl::StatusOr<WindowConfig> base = WindowConfig::Create(options);
  if (!base.ok()) return base.status();
  return SlidingWindowConfig{*base};
}

// ---- fixed_window ----

Outcome<FixedWindowState> Decide(const FixedWindowConfig& config, FixedWindowState state, Time now,
                                 int64_t cost) {
  const int64_t period = config.period().micros();
  const int64_t now_us = now.unix_micros();
  // A clock that went back stays in the latest window seen.
  const int64_t window = std::max(FloorDiv(now_us, period), state.window);
  const int64_t count = window == state.window ? state.count : 0;
  const int64_t until_end = (window + 1) * period - now_us;
  Decision d;
  d.limit = config.limit();
  if (cost > config.limit()) {
    d.retry_after = Duration::Infinite();
  } else if (count + cost <= config.limit()) {
    d.allowed = true;
    if (cost > 0) state = {window, count + cost};
  } else {
    d.retry_after = Duration::Micros(until_end);
  }
  const int64_t used = d.allowed ? count + cost : count;
  d.remaining = config.limit() - used;
  d.reset_after = Duration::Micros(used > 0 ? until_end : 0);
  return {state, d};
}

FixedWindowState Refund(const FixedWindowConfig& config, FixedWindowState state, Time taken_at,
                        int64_t cost) {
  if (state.window == FloorDiv(taken_at.unix_micros(), config.period().micros())) {
    state.count = std::max<int64_t>(0, state.count - cost);
  }
  return state;
}

Time FreshAt(const FixedWindowConfig& config, const FixedWindowState& state) {
  if (state.count == 0) return Time::FromUnixMicros(INT64_MIN);
  return Time::FromUnixMicros((state.window + 1) * config.period().micros());
}

// ---- sliding_window ----
//
// All comparisons are multiplied through by the period so that they stay in
// integers: the estimate prev*(1 - elapsed/period) + curr <= limit becomes
// prev*(period - elapsed) + curr*period <= limit*period, in 128 bits.

namespace {

using i128 = __int128;

struct Windows {
  int64_t index;
  int64_t prev;
  int64_t curr;
};

Windows Roll(const SlidingWindowState& state, int64_t index) {
  if (index == state.window) return {index, state.prev, state.curr};
  if (index == state.window + 1) return {index, state.curr, 0};
  return {index, 0, 0};
}

// Earliest elapsed time e in [0, period] of a window with `prev` behind it
// at which prev*(period - e) <= room*period; period when none before the end.
int64_t EarliestElapsed(int64_t prev, int64_t room, int64_t period) {
  if (prev == 0) return 0;
  const i128 fits = static_cast<i128>(room) * period / prev;  // floor
  if (fits >= period) return 0;
  return period - static_cast<int64_t>(fits);
}

}  // namespace

Outcome<SlidingWindowState> Decide(const SlidingWindowConfig& config, SlidingWindowState state,
                                   Time now, int64_t cost) {
  const int64_t period = config.period().micros();
  const int64_t limit = config.limit();
  const int64_t now_us = now.unix_micros();
  const Windows w = Roll(state, std::max(FloorDiv(now_us, period), state.window));
  const int64_t window_start = w.index * period;
  // Clamped: a clock that went back counts the previous window in full.
  const int64_t elapsed = std::clamp<int64_t>(now_us - window_start, 0, period - 1);
  const i128 weighted_prev = static_cast<i128>(w.prev) * (period - elapsed);
  const i128 capacity = static_cast<i128>(limit) * period;
  Decision d;
  d.limit = limit;
  int64_t curr = w.curr;
  if (cost > limit) {
    d.retry_after = Duration::Infinite();
  } else if (weighted_prev + static_cast<i128>(w.curr + cost) * period <= capacity) {
    d.allowed = true;
    curr += cost;
    if (cost > 0) state = {w.index, w.prev, curr};
  } else {
    // In this window, once prev's weight has shrunk enough; else in the next
    // one, where curr becomes prev; else two windows on, when all is gone.
    int64_t retry_at;
    const int64_t room = limit - w.curr - cost;
    const int64_t e_here = room >= 0 ? EarliestElapsed(w.prev, room, period) : period;
    if (e_here < period) {
      retry_at = window_start + e_here;
    } else {
      const int64_t e_next = EarliestElapsed(w.curr, limit - cost, period);
      retry_at = e_next < period ? window_start + period + e_next : window_start + 2 * period;
    }
    d.retry_after = Duration::Micros(std::max<int64_t>(retry_at - now_us, 1));
  }
  const i128 used = weighted_prev + static_cast<i128>(curr) * period;
  d.remaining = used >= capacity ? 0 : static_cast<int64_t>((capacity - used) / period);
  const int64_t fresh_at = curr > 0     ? window_start + 2 * period
                           : w.prev > 0 ? window_start + period
                                        : now_us;
  d.reset_after = Duration::Micros(std::max<int64_t>(fresh_at - now_us, 0));
  return {state, d};
}

SlidingWindowState Refund(const SlidingWindowConfig& config, SlidingWindowState state,
                          Time taken_at, int64_t cost) {
  const int64_t taken_window = FloorDiv(taken_at.unix_micros(), config.period().micros());
  if (taken_window == state.window) {
    state.curr = std::max<int64_t>(0, state.curr - cost);
  } else if (taken_window + 1 == state.window) {
    state.prev = std::max<int64_t>(0, state.prev - cost);
  }
  return state;
}

Time FreshAt(const SlidingWindowConfig& config, const SlidingWindowState& state) {
  const int64_t period = config.period().micros();
  if (state.curr > 0) return Time::FromUnixMicros((state.window + 2) * period);
  if (state.prev > 0) return Time::FromUnixMicros((state.window + 1) * period);
  return Time::FromUnixMicros(INT64_MIN);
}

}  // namespace sluice
