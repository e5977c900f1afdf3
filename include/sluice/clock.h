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
#include <thread>

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

// CoarseClock: SystemClock's time, read every `refresh` by a thread of its
// own and kept in one word, so that Now() is one relaxed load (about 1 ns,
// against about 27 ns for SystemClock on a virtual machine whose clock
// source is kvm-clock; bench/micro_bench.cc, BM_CoarseClockNow). For
// callers that decide millions of times a second and can afford decisions
// made at a time slightly in the past: LimiterOptions::clock.
//
// What it costs, exactly: Now() is never ahead of SystemClock and never goes
// backwards; it is behind by at most `refresh` plus the delay before the
// thread runs (under 1 ms with the default 250 us on a machine with a core
// to spare; more when every core is busy: coarse_clock_test measures it).
// Every algorithm stays exact with respect to the times it is given, so a
// limit is never passed on this clock's time scale; against true time, a
// window (or a bucket's refill) ends up to the staleness late, and a
// Retry-After may fall up to the staleness short for a client that follows
// it to the microsecond (sluice serve rounds it up to whole seconds, or
// milliseconds in JSON).
class CoarseClock final : public Clock {
 public:
  explicit CoarseClock(Duration refresh = Duration::Micros(250),
                       const Clock& source = SystemClock::Default());
  ~CoarseClock() override;
  CoarseClock(const CoarseClock&) = delete;
  CoarseClock& operator=(const CoarseClock&) = delete;

  Time Now() const override {
    return Time::FromUnixMicros(now_us_.load(std::memory_order_relaxed));
  }

 private:
  void Tick();

  const Clock& source_;
  const Duration refresh_;
  std::atomic<int64_t> now_us_;
  std::atomic<bool> stop_{false};
  std::thread ticker_;
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
