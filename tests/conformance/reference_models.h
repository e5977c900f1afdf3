// Reference models of the six algorithms, written from their documented
// semantics and independently of src/algorithm: no ticks, no shared bucket
// arithmetic. They compute in exact 128-bit integers scaled by the rate
// (a token is `period` units and `limit` units arrive per microsecond), keep
// plain lists and maps, and find retry times by search where the
// implementation solves for them. Each `Decide(now, cost)` returns the full
// Decision the algorithm must return.
//
// Time going backwards: the models encode each header's rule.
//   token_bucket, leaky_bucket police: decide as of the latest time a
//     request was admitted (nothing refills); durations count from `now`.
//   gcra, leaky_bucket shape: decide at `now` (a TAT / departure line that
//     looks further away).
//   fixed_window, sliding_window: the window is the latest one admitted into;
//     sliding_window's elapsed time is clamped to that window's start.
//   sliding_log: decide as of the latest time seen.
#ifndef SLUICE_TESTS_CONFORMANCE_REFERENCE_MODELS_H_
#define SLUICE_TESTS_CONFORMANCE_REFERENCE_MODELS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "sluice/algorithm/outcome.h"
#include "sluice/decision.h"
#include "sluice/rate.h"
#include "sluice/time.h"

namespace sluice::conformance {

using i128 = __int128;

// ceil(a / b) for b > 0, 0 when a <= 0.
inline int64_t CeilPositive(i128 a, i128 b) {
  return a <= 0 ? 0 : static_cast<int64_t>((a + b - 1) / b);
}

// floor(a / b) for b > 0.
inline int64_t FloorDivide(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ---- token_bucket and leaky_bucket police ----
class TokenBucketModel {
 public:
  TokenBucketModel(Rate rate, int64_t burst)
      : limit_(rate.limit), period_(rate.period.micros()), burst_(burst) {}

  Decision Decide(Time now_time, int64_t cost) {
    const int64_t now = now_time.unix_micros();
    const i128 full = static_cast<i128>(burst_) * period_;
    i128 tokens = full;
    int64_t at = now;
    if (touched_) {
      at = std::max(last_, now);
      const int64_t elapsed = std::max<int64_t>(0, now - last_);
      tokens = std::min(full, tokens_ + static_cast<i128>(limit_) * elapsed);
    }
    const int64_t lag = at - now;  // > 0: the clock is behind the bucket
    Decision d;
    d.limit = burst_;
    if (cost > burst_) {
      d.retry_after = Duration::Infinite();
    } else if (tokens >= static_cast<i128>(cost) * period_) {
      d.allowed = true;
      tokens -= static_cast<i128>(cost) * period_;
      if (cost > 0) {
        tokens_ = tokens;
        last_ = at;
        touched_ = true;
      }
    } else {
      d.retry_after =
          Duration::Micros(lag + CeilPositive(static_cast<i128>(cost) * period_ - tokens, limit_));
    }
    d.remaining = static_cast<int64_t>(tokens / period_);
    const int64_t until_full = CeilPositive(full - tokens, limit_);
    d.reset_after = Duration::Micros(until_full > 0 ? lag + until_full : 0);
    return d;
  }

 private:
  int64_t limit_, period_, burst_;
  bool touched_ = false;
  i128 tokens_ = 0;
  int64_t last_ = 0;
};

// ---- gcra: a theoretical arrival time, `limit` units per microsecond ----
class GcraModel {
 public:
  GcraModel(Rate rate, int64_t burst)
      : limit_(rate.limit), period_(rate.period.micros()), burst_(burst) {}

  Decision Decide(Time now_time, int64_t cost) {
    const i128 now = static_cast<i128>(now_time.unix_micros()) * limit_;
    const i128 tolerance = static_cast<i128>(burst_) * period_;
    const i128 used = std::max<i128>(0, tat_ - now);
    i128 used_after = used;
    Decision d;
    d.limit = burst_;
    if (cost > burst_) {
      d.retry_after = Duration::Infinite();
    } else if (used + static_cast<i128>(cost) * period_ <= tolerance) {
      d.allowed = true;
      used_after = used + static_cast<i128>(cost) * period_;
      if (cost > 0) tat_ = now + used_after;
    } else {
      d.retry_after = Duration::Micros(
          CeilPositive(used + static_cast<i128>(cost) * period_ - tolerance, limit_));
    }
    // Below zero when the clock stepped back behind what was taken: the
    // units the key is short, rounded up.
    d.remaining = used_after <= tolerance
                      ? static_cast<int64_t>((tolerance - used_after) / period_)
                      : -std::min(CeilPositive(used_after - tolerance, period_),
                                  kMaxDebtLimits * burst_);  // sluice's bound on a debt
    d.reset_after = Duration::Micros(CeilPositive(used_after, limit_));
    return d;
  }

 private:
  int64_t limit_, period_, burst_;
  i128 tat_ = 0;
};

// ---- leaky_bucket shape: a FIFO line of departure slots ----
class LeakyShapeModel {
 public:
  LeakyShapeModel(Rate rate, Duration max_delay, int64_t queue)
      : limit_(rate.limit), period_(rate.period.micros()) {
    if (max_delay == Duration::Zero() && queue == 0) max_delay = rate.period;
    // The longest a request's last unit may wait, in 1/limit us.
    bound_ = INT64_MAX;
    if (max_delay > Duration::Zero() || queue == 0) {
      bound_ = static_cast<i128>(max_delay.micros()) * limit_;
    }
    if (queue > 0) bound_ = std::min(bound_, static_cast<i128>(queue) * period_);
    capacity_ = static_cast<int64_t>(bound_ / period_) + 1;
  }

  int64_t capacity() const { return capacity_; }

  Decision Decide(Time now_time, int64_t cost) {
    const i128 now = static_cast<i128>(now_time.unix_micros()) * limit_;
    const i128 start = std::max(line_free_, now);  // the first free slot
    // Cost units that could still join the line if it were free at `free`.
    auto room_after = [&](i128 free) -> int64_t {
      const i128 wait = free - now;
      return wait > bound_ ? 0 : static_cast<int64_t>((bound_ - wait) / period_) + 1;
    };
    Decision d;
    d.limit = capacity_;
    const i128 last_unit_wait =
        start - now + static_cast<i128>(std::max<int64_t>(cost - 1, 0)) * period_;
    i128 free_after = start;
    if (cost > capacity_) {
      d.retry_after = Duration::Infinite();
    } else if (last_unit_wait <= bound_) {
      d.allowed = true;
      d.delay = Duration::Micros(CeilPositive(start - now, limit_));
      if (cost > 0) line_free_ = start + static_cast<i128>(cost) * period_;
      free_after = std::max(line_free_, now);
    } else {
      d.retry_after = Duration::Micros(CeilPositive(last_unit_wait - bound_, limit_));
    }
    d.remaining = room_after(free_after);
    d.reset_after = Duration::Micros(CeilPositive(free_after - now, limit_));
    return d;
  }

 private:
  int64_t limit_, period_;
  i128 bound_ = 0;
  int64_t capacity_ = 0;
  i128 line_free_ = 0;
};

// ---- fixed_window: a count per calendar window ----
class FixedWindowModel {
 public:
  explicit FixedWindowModel(Rate rate) : limit_(rate.limit), period_(rate.period.micros()) {}

  Decision Decide(Time now_time, int64_t cost) {
    const int64_t now = now_time.unix_micros();
    const int64_t window = std::max(FloorDivide(now, period_), latest_window_);
    int64_t& count = counts_[window];
    const int64_t until_end = (window + 1) * period_ - now;
    Decision d;
    d.limit = limit_;
    if (cost > limit_) {
      d.retry_after = Duration::Infinite();
    } else if (count + cost <= limit_) {
      d.allowed = true;
      if (cost > 0) {
        count += cost;
        latest_window_ = window;
      }
    } else {
      d.retry_after = Duration::Micros(until_end);
    }
    d.remaining = limit_ - count;
    d.reset_after = Duration::Micros(count > 0 ? until_end : 0);
    return d;
  }

 private:
  int64_t limit_, period_;
  int64_t latest_window_ = 0;
  std::map<int64_t, int64_t> counts_;
};

// ---- sliding_window: counts per window, weighted estimate ----
class SlidingWindowModel {
 public:
  explicit SlidingWindowModel(Rate rate) : limit_(rate.limit), period_(rate.period.micros()) {}

  Decision Decide(Time now_time, int64_t cost) {
    const int64_t now = now_time.unix_micros();
    const int64_t window = std::max(FloorDivide(now, period_), latest_window_);
    Decision d;
    d.limit = limit_;
    if (cost > limit_) {
      d.retry_after = Duration::Infinite();
    } else if (Fits(now, cost)) {
      d.allowed = true;
      if (cost > 0) {
        counts_[window] += cost;
        latest_window_ = window;
      }
    } else {
      // The estimate never grows while nothing is admitted: binary search
      // for the first microsecond at which the request fits.
      int64_t lo = now;                                            // does not fit
      int64_t hi = std::max(now, window * period_) + 2 * period_;  // fits: both windows gone
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (Fits(mid, cost) ? hi : lo) = mid;
      }
      d.retry_after = Duration::Micros(hi - now);
    }
    const i128 used = Estimate(now, 0);
    const i128 capacity = static_cast<i128>(limit_) * period_;
    // Below zero when the clock stepped back (the previous window then
    // counts in full): the units short, rounded up.
    d.remaining = used <= capacity ? static_cast<int64_t>((capacity - used) / period_)
                                   : -CeilPositive(used - capacity, period_);
    const int64_t prev = Count(window - 1), curr = Count(window);
    const int64_t fresh_at = curr > 0   ? (window + 2) * period_
                             : prev > 0 ? (window + 1) * period_
                                        : now;
    d.reset_after = Duration::Micros(std::max<int64_t>(0, fresh_at - now));
    return d;
  }

 private:
  int64_t Count(int64_t window) const {
    const auto it = counts_.find(window);
    return it == counts_.end() ? 0 : it->second;
  }
  // prev * (period - elapsed) + (curr + cost) * period: the estimate times period.
  i128 Estimate(int64_t now, int64_t cost) const {
    const int64_t window = std::max(FloorDivide(now, period_), latest_window_);
    const int64_t elapsed = std::clamp<int64_t>(now - window * period_, 0, period_ - 1);
    return static_cast<i128>(Count(window - 1)) * (period_ - elapsed) +
           static_cast<i128>(Count(window) + cost) * period_;
  }
  bool Fits(int64_t now, int64_t cost) const {
    return Estimate(now, cost) <= static_cast<i128>(limit_) * period_;
  }

  int64_t limit_, period_;
  int64_t latest_window_ = 0;
  std::map<int64_t, int64_t> counts_;
};

// ---- sliding_log: the list of admitted requests ----
class SlidingLogModel {
 public:
  explicit SlidingLogModel(Rate rate) : limit_(rate.limit), period_(rate.period.micros()) {}

  Decision Decide(Time now_time, int64_t cost) {
    const int64_t now = now_time.unix_micros();
    latest_ = std::max(latest_, now);
    // What left the window can never count again (latest_ never decreases).
    std::erase_if(admitted_, [&](const auto& entry) { return entry.first <= latest_ - period_; });
    Decision d;
    d.limit = limit_;
    if (cost > limit_) {
      d.retry_after = Duration::Infinite();
    } else if (CostIn(latest_) + cost <= limit_) {
      d.allowed = true;
      if (cost > 0) admitted_.push_back({latest_, cost});
    } else {
      // Candidate times: when each admitted request leaves the window.
      for (const auto& [time, c] : admitted_) {
        const int64_t candidate = time + period_;
        if (candidate > latest_ && CostIn(candidate) + cost <= limit_) {
          d.retry_after = Duration::Micros(candidate - now);
          break;
        }
      }
    }
    d.remaining = limit_ - CostIn(latest_);
    for (auto it = admitted_.rbegin(); it != admitted_.rend(); ++it) {
      if (it->first > latest_ - period_) {
        d.reset_after = Duration::Micros(it->first + period_ - now);
        break;
      }
    }
    return d;
  }

 private:
  // Cost admitted in the window (at - period, at].
  int64_t CostIn(int64_t at) const {
    int64_t sum = 0;
    for (const auto& [time, c] : admitted_) {
      if (time > at - period_ && time <= at) sum += c;
    }
    return sum;
  }

  int64_t limit_, period_;
  int64_t latest_ = 0;
  std::vector<std::pair<int64_t, int64_t>> admitted_;
};

}  // namespace sluice::conformance

#endif  // SLUICE_TESTS_CONFORMANCE_REFERENCE_MODELS_H_
