#include "sluice/algorithm/concurrency.h"

#include <algorithm>

#include "base/cat.h"

namespace sluice {

void HoldAverage::Observe(Duration hold) {
  const int64_t us = std::max<int64_t>(1, hold.micros());
  const int64_t old = us_.load(std::memory_order_relaxed);
  us_.store(old == 0 ? us : old + (us - old) / 8, std::memory_order_relaxed);
}

Duration HoldAverage::Cap(Duration retry_after) const {
  const Duration average = value();
  return average > Duration::Zero() && average < retry_after ? average : retry_after;
}

absl::StatusOr<ConcurrencyConfig> ConcurrencyConfig::Create(const ConcurrencyOptions& options) {
  if (options.limit < 1 || options.limit > kMaxSlidingLogLimit) {
    return absl::InvalidArgumentError(internal::Cat("limit must be 1 to ", kMaxSlidingLogLimit,
                                                    " requests in flight, got ", options.limit));
  }
  if (options.lease_ttl < kMinLeaseTtl || options.lease_ttl > kMaxLeaseTtl) {
    return absl::InvalidArgumentError(
        internal::Cat("lease_ttl must be ", FormatDuration(kMinLeaseTtl), " to ",
                      FormatDuration(kMaxLeaseTtl), ", got ", FormatDuration(options.lease_ttl)));
  }
  absl::StatusOr<SlidingLogConfig> log =
      SlidingLogConfig::Create({.rate = {.limit = options.limit, .period = options.lease_ttl}});
  if (!log.ok()) return log.status();
  return ConcurrencyConfig{*log};
}

}  // namespace sluice
