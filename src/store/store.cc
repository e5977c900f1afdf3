#include "sluice/store/store.h"

#include "base/cat.h"

namespace sluice {

absl::Status ValidateKey(std::string_view key) {
  if (key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(internal::Cat(
        "key of ", key.size(), " bytes is longer than the maximum of ", kMaxKeyLength));
  }
  return absl::OkStatus();
}

}  // namespace sluice

namespace sluice {

absl::StatusOr<BatchResult> DecideInProcess(std::span<LimitTable* const> tables,
                                            std::string_view key, BatchOp op, Time now,
                                            int64_t cost, Time taken_at) {
  BatchResult result;
  result.store_time = now;
  if (op == BatchOp::kRefund) {
    for (LimitTable* table : tables) {
      if (IsShape(table->config())) continue;
      if (absl::Status s = table->Refund(key, taken_at, cost); !s.ok()) return s;
    }
    return result;
  }
  bool denied = false;
  size_t taken = 0;
  for (LimitTable* table : tables) {
    absl::StatusOr<Decision> d = denied || op == BatchOp::kCheck ? table->Check(key, now, cost)
                                                                 : table->Decide(key, now, cost);
    if (!d.ok()) {
      for (size_t i = 0; i < taken; ++i) (void)tables[i]->Refund(key, now, cost);
      return d.status();
    }
    if (!d->allowed && !denied) {
      denied = true;
      for (size_t i = 0; i < taken; ++i) (void)tables[i]->Refund(key, now, cost);
    } else if (!denied && op == BatchOp::kDecide) {
      ++taken;
    }
    result.decisions.push_back(*d);
  }
  return result;
}

void Store::DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op,
                        Time now, int64_t cost, Time taken_at, BatchCallback done,
                        BatchCallback /*late*/) {
  done(DecideInProcess(tables, key, op, now, cost, taken_at));
}

}  // namespace sluice

namespace sluice {

absl::StatusOr<std::shared_ptr<LimitTable>> Store::OpenLeasedTable(const LimitConfig& /*config*/,
                                                                   std::string_view /*name*/,
                                                                   const LeaseOptions& /*lease*/) {
  return absl::InvalidArgumentError(
      "lease: only a limit in the shared store (scope: global, store.redis) can be leased");
}

}  // namespace sluice
