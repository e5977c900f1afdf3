// store/redis/lanes.h: coalescing (docs/distributed.md, "Several decisions
// in one call"). At most kMaxInFlight calls per lane (a Redis node; on a
// Cluster, a slot) are in flight; what arrives meanwhile waits, and goes in
// the next call when one is answered, up to max_batch requests a call. A
// request alone on its lane is sent at once: coalescing adds no wait at low
// load, and the wait it adds under load is bounded by a call in flight (its
// timeout at worst). A request whose deadline passes while it waits is
// handed back as expired, never sent.
//
// T is the store's request: anything with a `deadline` (a steady_clock
// time point). Thread-safe.
//
//   Lanes<Pending> lanes(64);
//   Batch now = lanes.Submit(lane, std::move(p));   // send `now` if not empty
//   ... when a call of `lane` is answered:
//   Batch next = lanes.Next(lane, SteadyClock::now(), expired);
#ifndef SLUICE_STORE_REDIS_LANES_H_
#define SLUICE_STORE_REDIS_LANES_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace sluice::redis {

template <typename T>
class Lanes {
 public:
  using Batch = std::vector<std::unique_ptr<T>>;
  static constexpr size_t kMaxInFlight = 2;

  explicit Lanes(size_t max_batch) : max_batch_(std::max<size_t>(1, max_batch)) {}

  // Queues `item` on `lane`; returns what to send now (nothing: it waits).
  // With a max_batch of 1 every request is sent at once.
  Batch Submit(uint32_t lane, std::unique_ptr<T> item) {
    Batch out;
    std::lock_guard lock(mu_);
    Lane& l = lanes_[lane];
    if (l.in_flight >= kMaxInFlight && max_batch_ > 1) {
      l.queue.push_back(std::move(item));
      return out;
    }
    ++l.in_flight;
    out.push_back(std::move(item));
    return out;
  }

  // A call of `lane` was answered: returns the next call's requests, in the
  // order they arrived (none: the lane has one call fewer in flight), and
  // moves those whose deadline is not after `now` to `expired`.
  Batch Next(uint32_t lane, std::chrono::steady_clock::time_point now, Batch& expired) {
    Batch out;
    std::lock_guard lock(mu_);
    auto it = lanes_.find(lane);
    if (it == lanes_.end()) return out;
    Lane& l = it->second;
    while (!l.queue.empty() && out.size() < max_batch_) {
      std::unique_ptr<T>& item = l.queue.front();
      (item->deadline <= now ? expired : out).push_back(std::move(item));
      l.queue.pop_front();
    }
    if (out.empty() && --l.in_flight == 0 && l.queue.empty()) lanes_.erase(it);
    return out;
  }

 private:
  struct Lane {
    size_t in_flight = 0;
    std::deque<std::unique_ptr<T>> queue;
  };
  const size_t max_batch_;
  std::mutex mu_;
  absl::flat_hash_map<uint32_t, Lane> lanes_;
};

}  // namespace sluice::redis

#endif  // SLUICE_STORE_REDIS_LANES_H_
