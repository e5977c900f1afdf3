// Shared by ParseDuration and ParseRate: the unit table and the number
// scanner. Internal.
#ifndef SLUICE_BASE_DURATION_TEXT_H_
#define SLUICE_BASE_DURATION_TEXT_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "sluice/time.h"

namespace sluice::internal {

// "us", "ms", "s", "sec", "second(s)", "m", "min", "minute(s)", "h", "hour(s)",
// "d", "day(s)".
std::optional<Duration> UnitDuration(std::string_view unit);

// `[count]unit`, count a decimal number that may have a fraction ("1.5s"),
// the result a whole number of microseconds. `what` names the text in errors.
// When `count_optional`, a bare unit ("s", "min") means one unit.
absl::StatusOr<Duration> ParseCountAndUnit(std::string_view text, std::string_view what,
                                           bool count_optional);

}  // namespace sluice::internal

#endif  // SLUICE_BASE_DURATION_TEXT_H_
