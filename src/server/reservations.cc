#include "server/reservations.h"

#include <utility>

namespace sluice::server {

bool Reservations::Add(std::string id, Time expires, Time now) {
  std::lock_guard lock(mu_);
  if (open_.size() >= kMaxReservations) {
    absl::erase_if(open_, [now](const auto& entry) { return entry.second <= now; });
    if (open_.size() >= kMaxReservations) return false;
  }
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

}  // namespace sluice::server
