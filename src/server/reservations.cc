#include "server/reservations.h"

#include <algorithm>
#include <cstring>

namespace sluice::server {
Reservations::Key Reservations::KeyOf(std::string_view signature) {
  Key key{};
  std::memcpy(key.data(), signature.data(), std::min(signature.size(), key.size()));
  return key;
}

bool Reservations::IsOpen(const Given& given) const {
  // Not settled yet (nor given again since with the same signature).
  const auto it = open_.find(given.key);
  return it != open_.end() && it->second == given.expires;
}

bool Reservations::PopOldest() {
  const Given oldest = given_.front();
  given_.pop_front();
  if (!IsOpen(oldest)) return false;
  open_.erase(oldest.key);
  return true;
}

void Reservations::ForgetOldestOpen() {
  while (!given_.empty()) {
    if (PopOldest()) return;
  }
}

void Reservations::DropExpired(Time now) {
  // All expire an hour after they are given, so the oldest first; a clock
  // stepped back leaves some for later, and Take still reads each expiry.
  while (!given_.empty() && given_.front().expires <= now) PopOldest();
}

void Reservations::Add(std::string_view signature, Time expires, Time now) {
  const Key key = KeyOf(signature);
  std::lock_guard lock(mu_);
  DropExpired(now);
  if (open_.size() >= max_) ForgetOldestOpen();
  given_.push_back({key, expires});
  open_.insert_or_assign(key, expires);
  // The settled ones leave their place in the order behind: dropped once
  // they are half of it, so it stays within twice the open ones (a pass
  // over it at most every as many additions as it holds open, plus 1024).
  if (given_.size() > 2 * open_.size() + 1024) {
    std::erase_if(given_, [this](const Given& g) { return !IsOpen(g); });
  }
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
