#include "sluice/algorithm/concurrency.h"

#include "base/cat.h"

namespace sluice {

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
