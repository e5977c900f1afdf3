// sluice/time.h: the integer time every sluice decision is made in.
//
// `Duration` is a signed count of microseconds; `Time` is a point on sluice's
// monotonic time line, counted in microseconds since the Unix epoch. The
// origin is the epoch so that `fixed_window` can align windows to calendar
// boundaries and so that Redis' TIME (also epoch microseconds) is the same
// kind of number; monotonic because the clock that produces it (clock.h)
// never steps back within a process. Microseconds because Lua numbers are
// doubles, exact to 2^53: epoch microseconds stay exact until the year 2255.
//
// Thread-safety: plain values.
//
//   sluice::Time t = clock.Now();
//   sluice::Duration d = sluice::Duration::Millis(250);
//   if (t + d > deadline) ...
#ifndef SLUICE_TIME_H_
#define SLUICE_TIME_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sluice {

class Duration {
 public:
  constexpr Duration() = default;
  static constexpr Duration Micros(int64_t us) { return Duration(us); }
  static constexpr Duration Millis(int64_t ms) { return Duration(ms * 1000); }
  static constexpr Duration Seconds(int64_t s) { return Duration(s * 1'000'000); }
  static constexpr Duration Minutes(int64_t m) { return Seconds(m * 60); }
  static constexpr Duration Hours(int64_t h) { return Minutes(h * 60); }
  static constexpr Duration Days(int64_t d) { return Hours(d * 24); }
  static constexpr Duration Zero() { return Duration(0); }
  // A retry_after of Infinite() means "this request can never pass".
  static constexpr Duration Infinite() { return Duration(std::numeric_limits<int64_t>::max()); }

  constexpr int64_t micros() const { return us_; }
  // Rounded up: a client told "retry after N" must never be early.
  constexpr int64_t CeilMillis() const { return us_ <= 0 ? 0 : (us_ + 999) / 1000; }
  constexpr int64_t CeilSeconds() const { return us_ <= 0 ? 0 : (us_ + 999'999) / 1'000'000; }
  constexpr bool IsInfinite() const { return *this == Infinite(); }

  constexpr Duration operator+(Duration o) const { return Duration(us_ + o.us_); }
  constexpr Duration operator-(Duration o) const { return Duration(us_ - o.us_); }
  constexpr Duration operator*(int64_t k) const { return Duration(us_ * k); }
  constexpr Duration& operator+=(Duration o) {
    us_ += o.us_;
    return *this;
  }
  constexpr auto operator<=>(const Duration&) const = default;

 private:
  constexpr explicit Duration(int64_t us) : us_(us) {}
  int64_t us_ = 0;
};

class Time {
 public:
  constexpr Time() = default;
  static constexpr Time FromUnixMicros(int64_t us) { return Time(us); }
  static constexpr Time UnixEpoch() { return Time(0); }
  constexpr int64_t unix_micros() const { return us_; }

  constexpr Time operator+(Duration d) const { return Time(us_ + d.micros()); }
  constexpr Time operator-(Duration d) const { return Time(us_ - d.micros()); }
  constexpr Duration operator-(Time o) const { return Duration::Micros(us_ - o.us_); }
  constexpr Time& operator+=(Duration d) {
    us_ += d.micros();
    return *this;
  }
  constexpr auto operator<=>(const Time&) const = default;

 private:
  constexpr explicit Time(int64_t us) : us_(us) {}
  int64_t us_ = 0;
};

// Parses "250ms", "2s", "1.5s", "5m", "1h", "1d", "100us" (also "min",
// "hour", "day"). Negative and overflowing durations are errors.
absl::StatusOr<Duration> ParseDuration(std::string_view text);

// The shortest exact spelling: "250ms", "2s", "1m", "1d", "1500us".
std::string FormatDuration(Duration d);

}  // namespace sluice

#endif  // SLUICE_TIME_H_
