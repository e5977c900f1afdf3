#include "server/reservations.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace sluice::server {
namespace {

// Whether `table` (values: when an entry ends) has room under `max`. A full
// table drops its ended entries, at most every 100 ms (`swept`): a table
// full of live entries is not walked for every insert.
template <typename Table>
bool HasRoom(Table& table, size_t max, Time now, Time& swept) {
  if (table.size() < max) return true;
  if (now - swept >= Duration::Millis(100)) {
    swept = now;
    absl::erase_if(table, [now](const auto& entry) { return entry.second <= now; });
  }
  return table.size() < max;
}

}  // namespace

bool Reservations::Add(std::string id, Time expires, Time now) {
  std::lock_guard lock(mu_);
  if (!HasRoom(open_, max_, now, swept_)) return false;
  open_.insert_or_assign(std::move(id), expires);
  return true;
}

bool Reservations::Take(std::string_view id, Time now) {
  std::lock_guard lock(mu_);
  auto it = open_.find(absl::string_view(id.data(), id.size()));  // (Abseil's own string_view)
  if (it == open_.end()) return false;
  const bool live = it->second > now;
  open_.erase(it);
  return live;
}

bool ReleasedSlots::FirstTime(uint64_t slot) {
  std::lock_guard lock(mu_);
  if (!seen_.insert(slot).second) return false;
  if (order_[next_] != 0) seen_.erase(order_[next_]);
  order_[next_] = slot;
  next_ = (next_ + 1) % order_.size();
  return true;
}

}  // namespace sluice::server
