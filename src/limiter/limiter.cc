#include "sluice/limiter.h"

#include <algorithm>

#include "base/cat.h"

namespace sluice {

using internal::Cat;

absl::StatusOr<std::unique_ptr<Limiter>> Limiter::Create(Store& store, LimiterOptions options) {
  std::unique_ptr<Limiter> limiter(new Limiter());
  limiter->name_ = options.name;
  limiter->clock_ = options.clock != nullptr ? options.clock : &SystemClock::Default();
  if (options.limits.empty()) {
    return absl::InvalidArgumentError(Cat("policy \"", options.name, "\": no limits"));
  }
  size_t shape_limits = 0;
  for (size_t i = 0; i < options.limits.size(); ++i) {
    absl::StatusOr<LimitConfig> config = MakeLimit(options.limits[i]);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          Cat("policy \"", options.name, "\" limit ", i + 1, ": ", config.status().message()));
    }
    if (IsShape(*config)) ++shape_limits;
    absl::StatusOr<std::shared_ptr<LimitTable>> table = store.OpenTable(*config);
    if (!table.ok()) return table.status();
    limiter->configs_.push_back(*std::move(config));
    limiter->tables_.push_back(*std::move(table));
  }
  if (shape_limits > 1) {
    return absl::InvalidArgumentError(Cat("policy \"", options.name,
                                          "\": at most one leaky_bucket shape limit per policy"));
  }
  for (size_t i = 0; i < limiter->configs_.size(); ++i) {
    if (!IsShape(limiter->configs_[i])) limiter->order_.push_back(i);
  }
  for (size_t i = 0; i < limiter->configs_.size(); ++i) {
    if (IsShape(limiter->configs_[i])) limiter->order_.push_back(i);
  }
  return limiter;
}

absl::StatusOr<PolicyDecision> Limiter::Acquire(std::string_view key, AcquireOptions options) {
  return AcquireAt(key, clock_->Now(), options.cost);
}

namespace {

// Among allowed decisions the one with the least remaining is the most
// restrictive; the largest delay wins over both.
void MergeAllowed(PolicyDecision& into, const Decision& d, size_t index, bool first) {
  const Duration delay = std::max(into.delay, d.delay);
  if (first || d.remaining < into.remaining) {
    static_cast<Decision&>(into) = d;
    into.limit_index = index;
  }
  into.delay = delay;
}

}  // namespace

absl::StatusOr<PolicyDecision> Limiter::AcquireAt(std::string_view key, Time now, int64_t cost) {
  if (cost < 0) {
    return absl::InvalidArgumentError(Cat("cost must not be negative, got ", cost));
  }
  PolicyDecision result;
  for (size_t n = 0; n < order_.size(); ++n) {
    const size_t i = order_[n];
    absl::StatusOr<Decision> d = tables_[i]->Decide(key, now, cost);
    if (!d.ok() || !d->allowed) {
      // Give back what the earlier limits took: all-or-nothing.
      for (size_t m = 0; m < n; ++m) {
        (void)tables_[order_[m]]->Refund(key, now, cost);
      }
      if (!d.ok()) return d.status();
      static_cast<Decision&>(result) = *d;
      result.limit_index = i;
      // Later limits may make the request wait longer still; Retry-After
      // must cover them all, so ask them too, taking nothing.
      for (size_t m = n + 1; m < order_.size(); ++m) {
        absl::StatusOr<Decision> later = tables_[order_[m]]->Check(key, now, cost);
        if (later.ok() && !later->allowed && later->retry_after > result.retry_after) {
          static_cast<Decision&>(result) = *later;
          result.limit_index = order_[m];
        }
      }
      return result;
    }
    MergeAllowed(result, *d, i, n == 0);
  }
  return result;
}

absl::Status Limiter::Refund(std::string_view key, Time taken_at, int64_t cost) {
  absl::Status result;
  for (size_t i : order_) {
    if (IsShape(configs_[i])) continue;  // a departure slot is not given back
    result.Update(tables_[i]->Refund(key, taken_at, cost));
  }
  return result;
}

absl::StatusOr<std::vector<Decision>> Limiter::Inspect(std::string_view key, Time now,
                                                       int64_t cost) {
  std::vector<Decision> out;
  for (const std::shared_ptr<LimitTable>& table : tables_) {
    absl::StatusOr<Decision> d = table->Check(key, now, cost);
    if (!d.ok()) return d.status();
    out.push_back(*d);
  }
  return out;
}

absl::StatusOr<PolicyDecision> Limiter::Check(std::string_view key, AcquireOptions options) {
  if (options.cost < 0) {
    return absl::InvalidArgumentError(Cat("cost must not be negative, got ", options.cost));
  }
  const Time now = clock_->Now();
  PolicyDecision result;
  bool denied = false;
  for (size_t n = 0; n < order_.size(); ++n) {
    const size_t i = order_[n];
    absl::StatusOr<Decision> d = tables_[i]->Check(key, now, options.cost);
    if (!d.ok()) return d.status();
    if (!d->allowed) {
      if (!denied || d->retry_after > result.retry_after) {
        static_cast<Decision&>(result) = *d;
        result.limit_index = i;
      }
      denied = true;
    } else if (!denied) {
      MergeAllowed(result, *d, i, n == 0);
    }
  }
  return result;
}

}  // namespace sluice
