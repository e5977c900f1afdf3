// sluice/clock.h: the one seam through which sluice reads time.
//
// Stores, the limiter and the server hold a `Clock&` and read it once per
// request; algorithms never read a clock (time is an argument). Tests and the
// simulator use `ManualClock` and advance it; nothing is mocked.
//
// `SystemClock` is monotonic (CLOCK_MONOTONIC) with its origin placed at the
// Unix epoch once, when the clock is created: wall-clock steps after that
// (NTP, an operator) do not move sluice time, and windows still align to the
// calendar as it was read at start-up.
//
// Thread-safety: Now() is safe from any thread on both clocks; ManualClock's
// Advance/Set are safe too (one atomic word).
//
//   sluice::ManualClock clock(sluice::Time::FromUnixMicros(0));
//   clock.Advance(sluice::Duration::Seconds(1));
#ifndef SLUICE_CLOCK_H_
#define SLUICE_CLOCK_H_

#include <atomic>
#include <chrono>

#include "sluice/time.h"

namespace sluice {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Time Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  SystemClock();
  Time Now() const override;
  // One process-wide instance, for callers that have no clock of their own.
  static const SystemClock& Default();

 private:
  std::chrono::steady_clock::time_point steady_origin_;
  int64_t unix_origin_us_;
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(Time start = Time::UnixEpoch()) : now_us_(start.unix_micros()) {}
  Time Now() const override {
    return Time::FromUnixMicros(now_us_.load(std::memory_order_acquire));
  }
  void Advance(Duration d) { now_us_.fetch_add(d.micros(), std::memory_order_acq_rel); }
  // May move backwards: tests use it to model a clock step.
  void Set(Time t) { now_us_.store(t.unix_micros(), std::memory_order_release); }

 private:
  std::atomic<int64_t> now_us_;
};

}  // namespace sluice

#endif  // SLUICE_CLOCK_H_
