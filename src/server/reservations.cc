#include "server/reservations.h"

#include <algorithm>
#include <cstring>

namespace sluice::server {
Reservations::Key Reservations::KeyOf(std::string_view signature) {
  Key key{};
  std::memcpy(key.data(), signature.data(), std::min(signature.size(), key.size()));
  return key;
}

void Reservations::ForgetOldest() {
  const Given& oldest = given_.front();
  // Unless settled already (or given again since, with the same signature).
  if (auto it = open_.find(oldest.key); it != open_.end() && it->second == oldest.expires) {
    open_.erase(it);
  }
  given_.pop_front();
}

void Reservations::DropExpired(Time now) {
  // All expire an hour after they are given, so the oldest first; a clock
  // stepped back leaves some for later, and Take still reads each expiry.
  while (!given_.empty() && given_.front().expires <= now) ForgetOldest();
}

void Reservations::Add(std::string_view signature, Time expires, Time now) {
  const Key key = KeyOf(signature);
  std::lock_guard lock(mu_);
  DropExpired(now);
  if (given_.size() >= max_) ForgetOldest();
  given_.push_back({key, expires});
  open_.insert_or_assign(key, expires);
}

bool Reservations::Take(std::string_view signature, Time now) {
  std::lock_guard lock(mu_);
  DropExpired(now);
  auto it = open_.find(KeyOf(signature));
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
