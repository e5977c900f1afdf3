// sluice/rate.h: "at most `limit` cost per `period`", and its text form.
//
// Accepted spellings: "100/s", "40/min", "5000/h", "1/day", "10/5s",
// "3/250ms". Units: us, ms, s (sec, second), m (min, minute), h (hour), d (day),
// each optionally preceded by a whole count ("5s", "250ms"). The limit is a
// positive integer; the period is at least 1us and at most 366 days.
//
// Thread-safety: plain values and pure functions.
//
//   absl::StatusOr<sluice::Rate> r = sluice::ParseRate("40/min");
//   // r->limit == 40, r->period == sluice::Duration::Minutes(1)
#ifndef SLUICE_RATE_H_
#define SLUICE_RATE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/time.h"

namespace sluice {

inline constexpr Duration kMaxPeriod = Duration::Days(366);
// Large enough for byte budgets (cost = bytes), small enough that
// limit * period arithmetic never leaves 128 bits.
inline constexpr int64_t kMaxLimit = int64_t{1} << 40;

struct Rate {
  int64_t limit = 0;
  Duration period;

  friend bool operator==(const Rate&, const Rate&) = default;
};

absl::StatusOr<Rate> ParseRate(std::string_view text);

// OK when 1 <= limit <= kMaxLimit and 1us <= period <= kMaxPeriod.
absl::Status ValidateRate(const Rate& rate);

// "40/min" style when the period is one unit, "10/5s" otherwise.
std::string FormatRate(const Rate& rate);

}  // namespace sluice

#endif  // SLUICE_RATE_H_
