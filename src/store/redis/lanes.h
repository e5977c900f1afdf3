// store/redis/lanes.h: coalescing (docs/distributed.md, "Several decisions
// in one call"). At most max_in_flight calls per lane (a Redis node; on a
// Cluster, a slot) are in flight; what arrives meanwhile waits, and goes in
// the next call when one is answered, up to max_batch requests a call
// and, while another call is in flight, up to its share of the requests
// going round the lane (Share). A request alone on its lane is sent at
// once, with one exception, the linger: right after a call of several
// requests was answered, those who sent them are likely to send again
// soon, so a request that finds the lane free within kHotFor lingers of
// that answer waits, at most `linger`, until as many have arrived as that
// call carried (then they go at once), or until the caller's Flush.
// Coalescing adds no wait at low load (a call of one request is followed
// by no linger), and the wait it adds under load is bounded by a call in
// flight (its timeout at worst) or by one linger. A request whose deadline
// passes while it waits is handed back as expired, never sent.
//
// T is the store's request: anything with a `deadline` (a steady_clock
// time point). Thread-safe.
//
//   Lanes<Pending> lanes(64, std::chrono::microseconds(100), 2);
//   bool flush_later = false;
//   Batch now = lanes.Submit(lane, std::move(p), &flush_later);  // send `now` if not empty
//   if (flush_later) ... once lanes.linger() has passed: send lanes.Flush(lane, now, expired)
//   ... when a call of `lane` carrying n requests is answered:
//   Batch next = lanes.Next(lane, SteadyClock::now(), expired, n);
#ifndef SLUICE_STORE_REDIS_LANES_H_
#define SLUICE_STORE_REDIS_LANES_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace sluice::redis {

template <typename T>
class Lanes {
 public:
  using Batch = std::vector<std::unique_ptr<T>>;
  using Clock = std::chrono::steady_clock;
  // How long after a call of several requests was answered the lane
  // lingers, in lingers.
  static constexpr int kHotFor = 10;

  explicit Lanes(size_t max_batch, Clock::duration linger = Clock::duration::zero(),
                 size_t max_in_flight = 2)
      : max_batch_(std::max<size_t>(1, max_batch)),
        linger_(linger),
        max_in_flight_(std::max<size_t>(1, max_in_flight)) {}

  Clock::duration linger() const { return linger_; }

  // Queues `item` on `lane`; returns what to send now (nothing: it waits).
  // With a max_batch of 1 every request is sent at once. `flush_later`
  // (when given) is set when the caller is to call Flush(lane) once
  // linger() has passed; without it no request lingers.
  Batch Submit(uint32_t lane, std::unique_ptr<T> item, bool* flush_later = nullptr) {
    std::lock_guard lock(mu_);
    Lane& l = lanes_[lane];
    l.queue.push_back(std::move(item));
    return Admit(l, flush_later);
  }

  // The same for several requests asked together, in order: as many as a
  // call may carry go now, the rest wait for the lane's next call.
  Batch Submit(uint32_t lane, Batch items, bool* flush_later = nullptr) {
    std::lock_guard lock(mu_);
    Lane& l = lanes_[lane];
    for (std::unique_ptr<T>& item : items) l.queue.push_back(std::move(item));
    return Admit(l, flush_later);
  }

  // A call of `lane` carrying `answered` requests was answered: returns the
  // next call's requests, in the order they arrived (none: the lane has one
  // call fewer in flight), and moves those whose deadline is not after
  // `now` to `expired`. With `answered` above 1 the requests that arrive
  // within linger() linger.
  Batch Next(uint32_t lane, Clock::time_point now, Batch& expired, size_t answered = 0) {
    Batch out;
    std::lock_guard lock(mu_);
    auto it = lanes_.find(lane);
    if (it == lanes_.end()) return out;
    Lane& l = it->second;
    l.carried -= std::min(l.carried, answered);
    // With another call in flight, this one carries a share of the
    // requests going round (those in flight, those waiting, and those
    // whose answers this call brings, which tend to come back): see Share.
    l.cap = l.in_flight > 1 ? Share(l, answered) : max_batch_;
    Take(l, now, out, expired, l.cap);
    l.carried += out.size();
    if (linger_ > Clock::duration::zero() && answered > 1) {
      l.expect = answered;
      l.hot_until = now + kHotFor * linger_;
    }
    if (out.empty() && --l.in_flight == 0 && l.queue.empty() && l.expect <= 1 && !l.flush_due) {
      lanes_.erase(it);
    }
    return out;
  }

  // The linger Submit asked the caller for has passed: returns what waits
  // on `lane` if a call may go now (otherwise it goes with the next
  // answer), moving the expired to `expired`.
  Batch Flush(uint32_t lane, Clock::time_point now, Batch& expired) {
    Batch out;
    std::lock_guard lock(mu_);
    auto it = lanes_.find(lane);
    if (it == lanes_.end()) return out;
    Lane& l = it->second;
    l.flush_due = false;
    if (l.in_flight < max_in_flight_) {
      Take(l, now, out, expired, CallSize(l));
      if (!out.empty()) ++l.in_flight;
      l.carried += out.size();
    }
    if (l.in_flight == 0 && l.queue.empty() && now >= l.hot_until) lanes_.erase(it);
    return out;
  }

 private:
  struct Lane {
    size_t in_flight = 0;
    // The requests the calls in flight carry, and how many the next call
    // may carry while another is in flight (Share).
    size_t carried = 0;
    size_t cap = std::numeric_limits<size_t>::max();
    std::deque<std::unique_ptr<T>> queue;
    // The linger: requests arriving before hot_until wait for `expect` of
    // them; flush_due while the caller's Flush is to come.
    size_t expect = 0;
    Clock::time_point hot_until{};
    bool flush_due = false;
  };

  // What of l's queue (just joined by new requests) goes now: nothing
  // while max_in_flight_ calls are out or while the lane lingers,
  // otherwise a call of up to CallSize.
  Batch Admit(Lane& l, bool* flush_later) {
    Batch out;
    if (max_batch_ > 1 && l.in_flight >= max_in_flight_) return out;
    const size_t call = CallSize(l);
    if (max_batch_ > 1 && flush_later != nullptr && l.expect > 1) {
      if (Clock::now() < l.hot_until) {
        if (l.queue.size() < std::min(l.expect, call)) {
          if (!l.flush_due) *flush_later = l.flush_due = true;
          return out;
        }
      } else {
        l.expect = 0;
      }
    }
    ++l.in_flight;
    while (!l.queue.empty() && out.size() < call) {
      out.push_back(std::move(l.queue.front()));
      l.queue.pop_front();
    }
    l.carried += out.size();
    return out;
  }

  // A call's share of the requests going round a lane: what its calls in
  // flight carry, what waits, and `returning` (the requests of the call
  // just answered, whose senders tend to send again at once), split evenly
  // over max_in_flight_ + 1 groups. A group is then being decided in each
  // call in flight while the last one's answers are handed out and its
  // senders send again, so neither Redis nor this process waits for the
  // other. Redis reads what has arrived on a connection, runs all of it,
  // and only then writes the answers: a call much larger than the others
  // leaves Redis idle while its answers are handed out, and a call that
  // arrives with another is answered only after both. At most max_batch_.
  size_t Share(const Lane& l, size_t returning) const {
    const size_t going_round = l.carried + l.queue.size() + returning;
    const size_t groups = max_in_flight_ + 1;
    return std::clamp<size_t>((going_round + groups - 1) / groups, 1, max_batch_);
  }

  // The most a call that goes now, beside those in flight, may carry: the
  // share Next set while another call is in flight, else max_batch_.
  size_t CallSize(const Lane& l) const {
    return l.in_flight > 0 ? std::min(l.cap, max_batch_) : max_batch_;
  }

  // Up to `most` of l's queue into `out`, the expired into `expired`.
  void Take(Lane& l, Clock::time_point now, Batch& out, Batch& expired, size_t most) {
    while (!l.queue.empty() && out.size() < most) {
      std::unique_ptr<T>& item = l.queue.front();
      (item->deadline <= now ? expired : out).push_back(std::move(item));
      l.queue.pop_front();
    }
  }

  const size_t max_batch_;
  const Clock::duration linger_;
  const size_t max_in_flight_;
  std::mutex mu_;
  absl::flat_hash_map<uint32_t, Lane> lanes_;
};

}  // namespace sluice::redis

#endif  // SLUICE_STORE_REDIS_LANES_H_
