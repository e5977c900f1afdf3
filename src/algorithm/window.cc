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

namespace {

// The most a window algorithm's count may reach with debt: the limit and
// kMaxDebtLimits limits more, repaid within 2^51 us (71 years; the Redis
// functions compute times in doubles, exact below 2^53).
int64_t MaxWindowCount(const WindowConfig& config) {
  const int64_t windows =
      std::min<int64_t>(kMaxDebtLimits, (int64_t{1} << 51) / config.period().micros());
  return config.limit() * (1 + windows);  // limit <= 2^40: no overflow
}

// The windows after `count`'s until it is spent: what is over the limit
// (debt, Charge) is carried into the next window, and repaid at the limit
// per window; a count within the limit lasts its own window.
int64_t WindowsSpanned(int64_t count, int64_t limit) {
  return count <= 0 ? 0 : std::max<int64_t>(1, (count - 1) / limit + 1);
}

// The count of `window` (at or after the state's): the state's own, or
// what is left of its debt.
int64_t CountIn(const FixedWindowState& state, int64_t window, int64_t limit) {
  if (window == state.window) return state.count;
  const int64_t later = window - state.window;
  if (later >= WindowsSpanned(state.count, limit)) return 0;
  return std::max<int64_t>(0, state.count - later * limit);
}

}  // namespace

Outcome<FixedWindowState> Decide(const FixedWindowConfig& config, FixedWindowState state, Time now,
                                 int64_t cost) {
  const int64_t period = config.period().micros();
  const int64_t limit = config.limit();
  const int64_t now_us = now.unix_micros();
  // A clock that went back stays in the latest window seen.
  const int64_t window = std::max(FloorDiv(now_us, period), state.window);
  const int64_t count = CountIn(state, window, limit);
  const int64_t start = window * period;
  Decision d;
  d.limit = limit;
  if (cost > limit) {
    d.retry_after = Duration::Infinite();
  } else if (count + cost <= limit) {
    d.allowed = true;
    if (cost > 0) state = {window, count + cost};
  } else {
    // The window where the request fits: the next, unless debt is left.
    d.retry_after =
        Duration::Micros(start + WindowsSpanned(count + cost - limit, limit) * period - now_us);
  }
  const int64_t used = d.allowed ? count + cost : count;
  d.remaining = limit - used;  // below zero by a debt (Charge)
  d.reset_after =
      Duration::Micros(used > 0 ? start + WindowsSpanned(used, limit) * period - now_us : 0);
  return {state, d};
}

FixedWindowState Charge(const FixedWindowConfig& config, FixedWindowState state, Time now,
                        int64_t cost) {
  if (cost <= 0) return state;
  const int64_t limit = config.limit();
  const int64_t window =
      std::max(FloorDiv(now.unix_micros(), config.period().micros()), state.window);
  const int64_t count = CountIn(state, window, limit);
  const int64_t max = MaxWindowCount(config);
  return {window, cost >= max - count ? std::max(max, count) : count + cost};
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
  return Time::FromUnixMicros((state.window + WindowsSpanned(state.count, config.limit())) *
                              config.period().micros());
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

// The counts `later` windows after (prev, curr): what is over the limit in
// curr (debt, Charge) is carried into the next window, and repaid at the
// limit per window. Within the limit, curr becomes prev, then nothing.
Windows RollBy(int64_t index, int64_t prev, int64_t curr, int64_t later, int64_t limit) {
  if (later == 0) return {index, prev, curr};
  // k windows on: curr - k * limit left over, curr - (k - 1) * limit behind
  // it (each at most one limit, none below zero).
  const auto left = [&](int64_t k) {
    return k > curr / limit + 1 ? int64_t{0} : std::max<int64_t>(0, curr - k * limit);
  };
  return {index + later, std::min(limit, left(later - 1)), left(later)};
}

Windows Roll(const SlidingWindowState& state, int64_t index, int64_t limit) {
  return RollBy(state.window, state.prev, state.curr, index - state.window, limit);
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
  const Windows w = Roll(state, std::max(FloorDiv(now_us, period), state.window), limit);
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
    // Under debt, the first window where curr leaves room, or the one after.
    int64_t retry_at;
    const int64_t room = limit - w.curr - cost;
    const int64_t e_here = room >= 0 ? EarliestElapsed(w.prev, room, period) : period;
    if (e_here < period) {
      retry_at = window_start + e_here;
    } else {
      const int64_t k = std::max<int64_t>(1, WindowsSpanned(w.curr + cost - limit, limit));
      const Windows then = RollBy(w.index, w.prev, w.curr, k, limit);
      const int64_t e_then = EarliestElapsed(then.prev, limit - then.curr - cost, period);
      retry_at =
          e_then < period ? window_start + k * period + e_then : window_start + (k + 1) * period;
    }
    d.retry_after = Duration::Micros(std::max<int64_t>(retry_at - now_us, 1));
  }
  const i128 used = weighted_prev + static_cast<i128>(curr) * period;
  // floor((capacity - used) / period): below zero by a debt (Charge).
  const i128 left = capacity - used;
  d.remaining = static_cast<int64_t>(left >= 0 ? left / period : -((-left + period - 1) / period));
  const int64_t fresh_at = curr > 0     ? window_start + (WindowsSpanned(curr, limit) + 1) * period
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

SlidingWindowState Charge(const SlidingWindowConfig& config, SlidingWindowState state, Time now,
                          int64_t cost) {
  if (cost <= 0) return state;
  const int64_t limit = config.limit();
  const Windows w = Roll(
      state, std::max(FloorDiv(now.unix_micros(), config.period().micros()), state.window), limit);
  const int64_t max = MaxWindowCount(config);
  return {w.index, w.prev, cost >= max - w.curr ? std::max(max, w.curr) : w.curr + cost};
}

Time FreshAt(const SlidingWindowConfig& config, const SlidingWindowState& state) {
  const int64_t period = config.period().micros();
  if (state.curr > 0) {
    return Time::FromUnixMicros((state.window + WindowsSpanned(state.curr, config.limit()) + 1) *
                                period);
  }
  if (state.prev > 0) return Time::FromUnixMicros((state.window + 1) * period);
  return Time::FromUnixMicros(INT64_MIN);
}

}  // namespace sluice
