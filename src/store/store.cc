#include "sluice/store/store.h"

#include "base/cat.h"

namespace sluice {

absl::Status KeyTooLongError(size_t size) {
  return absl::InvalidArgumentError(
      internal::Cat("key of ", size, " bytes is longer than the maximum of ", kMaxKeyLength));
}

}  // namespace sluice

namespace sluice {

absl::StatusOr<BatchResult> DecideInProcess(std::span<LimitTable* const> tables,
                                            std::string_view key, BatchOp op, Time now,
                                            int64_t cost, Time taken_at, uint64_t slot) {
  BatchResult result;
  result.store_time = now;
  if (op == BatchOp::kRefund) {
    for (LimitTable* table : tables) {
      if (IsShape(table->config())) continue;
      if (absl::Status s = table->Refund(key, taken_at, cost, slot); !s.ok()) return s;
    }
    return result;
  }
  if (op == BatchOp::kCharge) {
    for (LimitTable* table : tables) {
      if (!Charges(table->config())) continue;
      if (absl::Status s = table->Charge(key, now, cost); !s.ok()) return s;
    }
    return result;
  }
  bool denied = false;
  size_t taken = 0;
  if (op == BatchOp::kRenew) {
    for (LimitTable* table : tables) {
      absl::StatusOr<Decision> d =
          denied ? table->Check(key, now, cost) : table->Renew(key, taken_at, now, cost, slot);
      if (d.ok() && !d->allowed && !denied) denied = true;
      if (d.ok() && d->allowed && !denied) ++taken;
      if (!d.ok() || denied) {
        for (size_t i = 0; i < taken; ++i) (void)tables[i]->Refund(key, now, cost, slot);
        taken = 0;
        if (!d.ok()) return d.status();
      }
      result.decisions.push_back(*d);
    }
    return result;
  }
  for (LimitTable* table : tables) {
    absl::StatusOr<Decision> d = denied || op == BatchOp::kCheck
                                     ? table->Check(key, now, cost)
                                     : table->Hold(key, now, cost, slot);
    if (!d.ok()) {
      for (size_t i = 0; i < taken; ++i) (void)tables[i]->Refund(key, now, cost, slot);
      return d.status();
    }
    if (!d->allowed && !denied) {
      denied = true;
      for (size_t i = 0; i < taken; ++i) (void)tables[i]->Refund(key, now, cost, slot);
    } else if (!denied && op == BatchOp::kDecide) {
      ++taken;
    }
    result.decisions.push_back(*d);
  }
  return result;
}

void Store::DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op,
                        Time now, int64_t cost, Time taken_at, uint64_t slot, BatchCallback done,
                        BatchCallback /*late*/) {
  done(DecideInProcess(tables, key, op, now, cost, taken_at, slot));
}

}  // namespace sluice

namespace sluice {

absl::Status ValidateLease(const LimitConfig& config, const LeaseOptions& lease) {
  using internal::Cat;
  if (lease.size < 0) return absl::InvalidArgumentError("size must be auto or positive");
  if (lease.ttl <= Duration::Zero()) return absl::InvalidArgumentError("ttl must be positive");
  const std::string_view name = AlgorithmName(AlgorithmOf(config));
  if (std::holds_alternative<FixedWindowConfig>(config)) return absl::OkStatus();
  const BucketConfig* bucket = nullptr;
  if (const auto* c = std::get_if<GcraConfig>(&config)) bucket = c;
  if (const auto* c = std::get_if<TokenBucketConfig>(&config)) bucket = c;
  if (bucket == nullptr) {
    return absl::InvalidArgumentError(
        Cat(name,
            " cannot be leased: a slice cannot reserve what it weighs or schedules; "
            "fixed_window, gcra and token_bucket can (docs/distributed.md, \"Leased limits\")"));
  }
  // A slice's slots are spent within the burst tolerance (burst - 1
  // emission intervals): too short a one leaves no time to spend them.
  const BucketRate& r = bucket->bucket_rate();
  const int64_t tolerance_us = (bucket->capacity_ticks() - r.ticks_per_token) / r.ticks_per_us;
  if (bucket->burst() < 2 || tolerance_us < kMinLeaseTolerance.micros()) {
    return absl::InvalidArgumentError(
        Cat(name, " with burst ", bucket->burst(), " at ", FormatRate(bucket->rate()),
            " cannot be leased: a leased bucket needs a burst of 2 or more spanning at least ",
            FormatDuration(kMinLeaseTolerance),
            " beyond one request ((burst - 1) x period / limit) to spend its slices in"));
  }
  return absl::OkStatus();
}

void Store::ClaimQuota(std::string_view /*bucket*/, std::string_view /*instance*/, int64_t /*want*/,
                       int64_t /*floor*/, int64_t /*limit*/, Duration /*ttl*/,
                       std::function<void(absl::StatusOr<QuotaClaim>)> done) {
  done(absl::UnimplementedError("quota claims need a shared store (store.redis)"));
}

absl::StatusOr<std::shared_ptr<LimitTable>> Store::OpenLeasedTable(const LimitConfig& /*config*/,
                                                                   std::string_view /*name*/,
                                                                   const LeaseOptions& /*lease*/) {
  return absl::InvalidArgumentError(
      "lease: only a limit in the shared store (scope: global, store.redis) can be leased");
}

}  // namespace sluice
