#include "sluice/time.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "base/cat.h"
#include "base/duration_text.h"

namespace sluice {
namespace internal {

std::optional<Duration> UnitDuration(std::string_view unit) {
  static constexpr std::array<std::pair<std::string_view, Duration>, 19> kUnits = {{
      {"us", Duration::Micros(1)},      {"ms", Duration::Millis(1)},
      {"s", Duration::Seconds(1)},      {"sec", Duration::Seconds(1)},
      {"second", Duration::Seconds(1)}, {"seconds", Duration::Seconds(1)},
      {"m", Duration::Minutes(1)},      {"min", Duration::Minutes(1)},
      {"minute", Duration::Minutes(1)}, {"minutes", Duration::Minutes(1)},
      {"h", Duration::Hours(1)},        {"hour", Duration::Hours(1)},
      {"hours", Duration::Hours(1)},    {"hr", Duration::Hours(1)},
      {"d", Duration::Days(1)},         {"day", Duration::Days(1)},
      {"days", Duration::Days(1)},      {"mins", Duration::Minutes(1)},
      {"secs", Duration::Seconds(1)},
  }};
  for (const auto& [name, d] : kUnits) {
    if (unit == name) return d;
  }
  return std::nullopt;
}

absl::StatusOr<Duration> ParseCountAndUnit(std::string_view text, std::string_view what,
                                           bool count_optional) {
  size_t i = 0;
  // Whole part and fraction, kept as an integer numerator over 10^digits.
  __int128 numerator = 0;
  int64_t denominator = 1;
  bool any_digit = false;
  bool in_fraction = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.' && !in_fraction) {
      in_fraction = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    any_digit = true;
    numerator = numerator * 10 + (c - '0');
    if (in_fraction) {
      if (denominator >= 1'000'000'000) {
        return absl::InvalidArgumentError(
            internal::Cat(what, " \"", text, "\": too many digits after the decimal point"));
      }
      denominator *= 10;
    }
    if (numerator > (static_cast<__int128>(1) << 70)) {
      return absl::InvalidArgumentError(internal::Cat(what, " \"", text, "\": number too large"));
    }
  }
  std::string_view unit = text.substr(i);
  if (!any_digit) {
    if (!count_optional || in_fraction) {
      return absl::InvalidArgumentError(internal::Cat(
          what, " \"", text, "\": expected a number followed by a unit, e.g. 250ms, 2s, 5m"));
    }
    numerator = 1;
  }
  if (unit.empty()) {
    return absl::InvalidArgumentError(
        internal::Cat(what, " \"", text, "\": missing unit (one of us, ms, s, m or min, h, d)"));
  }
  const std::optional<Duration> unit_d = UnitDuration(unit);
  if (!unit_d) {
    return absl::InvalidArgumentError(internal::Cat(what, " \"", text, "\": unknown unit \"", unit,
                                                    "\" (use us, ms, s, m or min, h, d)"));
  }
  const __int128 scaled = numerator * unit_d->micros();
  if (scaled % denominator != 0) {
    return absl::InvalidArgumentError(
        internal::Cat(what, " \"", text, "\": not a whole number of microseconds"));
  }
  const __int128 us = scaled / denominator;
  if (us > std::numeric_limits<int64_t>::max() / 4) {
    return absl::InvalidArgumentError(internal::Cat(what, " \"", text, "\": too long"));
  }
  return Duration::Micros(static_cast<int64_t>(us));
}

}  // namespace internal

absl::StatusOr<Duration> ParseDuration(std::string_view text) {
  if (!text.empty() && text.front() == '-') {
    return absl::InvalidArgumentError(
        internal::Cat("duration \"", text, "\": must not be negative"));
  }
  return internal::ParseCountAndUnit(text, "duration", /*count_optional=*/false);
}

std::string FormatDuration(Duration d) {
  if (d.IsInfinite()) return "inf";
  if (d == Duration::Zero()) return "0s";
  const int64_t us = d.micros();
  static constexpr std::array<std::pair<int64_t, std::string_view>, 5> kUnits = {{
      {86'400'000'000, "d"},
      {3'600'000'000, "h"},
      {60'000'000, "m"},
      {1'000'000, "s"},
      {1000, "ms"},
  }};
  for (const auto& [size, name] : kUnits) {
    if (us != 0 && us % size == 0) return internal::Cat(us / size, name);
  }
  return internal::Cat(us, "us");
}

}  // namespace sluice
