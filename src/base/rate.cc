#include "sluice/rate.h"

#include <charconv>

#include "base/cat.h"
#include "base/duration_text.h"

namespace sluice {

absl::Status ValidateRate(const Rate& rate) {
  if (rate.limit <= 0) {
    return absl::InvalidArgumentError(
        internal::Cat("rate limit must be at least 1, got ", rate.limit));
  }
  if (rate.limit > kMaxLimit) {
    return absl::InvalidArgumentError(
        internal::Cat("rate limit ", rate.limit, " is above the maximum ", kMaxLimit));
  }
  if (rate.period <= Duration::Zero()) {
    return absl::InvalidArgumentError(
        internal::Cat("rate period must be positive, got ", rate.period.micros(), "us"));
  }
  if (rate.period > kMaxPeriod) {
    return absl::InvalidArgumentError(internal::Cat("rate period ", FormatDuration(rate.period),
                                                    " is longer than the maximum 366d"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Rate> ParseRate(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) {
    return absl::InvalidArgumentError(
        internal::Cat("rate \"", text, "\": expected LIMIT/PERIOD, e.g. 100/s, 40/min, 10/5s"));
  }
  const std::string_view limit_text = text.substr(0, slash);
  const std::string_view period_text = text.substr(slash + 1);
  if (limit_text.empty()) {
    return absl::InvalidArgumentError(
        internal::Cat("rate \"", text, "\": missing limit before '/'"));
  }
  if (limit_text.front() == '-') {
    return absl::InvalidArgumentError(internal::Cat("rate \"", text, "\": limit must be positive"));
  }
  int64_t limit = 0;
  const auto [end, ec] =
      std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
  if (ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(internal::Cat("rate \"", text, "\": limit too large"));
  }
  if (ec != std::errc() || end != limit_text.data() + limit_text.size()) {
    return absl::InvalidArgumentError(
        internal::Cat("rate \"", text, "\": limit \"", limit_text, "\" is not a whole number"));
  }
  if (period_text.empty()) {
    return absl::InvalidArgumentError(internal::Cat(
        "rate \"", text, "\": missing period after '/' (e.g. s, min, h, day, 5s, 250ms)"));
  }
  absl::StatusOr<Duration> period =
      internal::ParseCountAndUnit(period_text, internal::Cat("rate \"", text, "\": period"),
                                  /*count_optional=*/true);
  if (!period.ok()) return period.status();
  const Rate rate{limit, *period};
  if (absl::Status s = ValidateRate(rate); !s.ok()) {
    return absl::InvalidArgumentError(internal::Cat("rate \"", text, "\": ", s.message()));
  }
  return rate;
}

std::string FormatRate(const Rate& rate) {
  const int64_t us = rate.period.micros();
  if (us == 1'000'000) return internal::Cat(rate.limit, "/s");
  if (us == 60'000'000) return internal::Cat(rate.limit, "/min");
  if (us == 3'600'000'000) return internal::Cat(rate.limit, "/h");
  if (us == 86'400'000'000) return internal::Cat(rate.limit, "/day");
  return internal::Cat(rate.limit, "/", FormatDuration(rate.period));
}

}  // namespace sluice
