// sluice/algorithm/leaky_bucket.h: the leaky bucket, as a meter or a queue.
//
// mode police (a meter): the bucket holds a level that leaks at `rate`; a
// request of cost c raises it by c and is rejected, never delayed, if the
// level would pass `burst`. Same admission set as token_bucket (the level is
// the bucket's empty part); the state is level + time.
//
// mode shape (a queue): each admitted request is given a departure time so
// that departures are spaced 1/rate apart (cost c takes c intervals); the
// request is held for `delay` and then released. A request that would wait
// longer than `max_delay`, or stand beyond `queue` places, is rejected.
// Nothing is ever released faster than `rate`. State: the next free
// departure time, in ticks, one word.
//
// Pure functions; callers serialize access to one State.
//
//   auto config = sluice::LeakyShapeConfig::Create(
//       {.rate = *sluice::ParseRate("10/s"), .max_delay = sluice::Duration::Seconds(5)});
//   auto [next, d] = sluice::Decide(*config, sluice::LeakyShapeState{}, now, 1);
//   // hold the request for d.delay, then forward it
#ifndef SLUICE_ALGORITHM_LEAKY_BUCKET_H_
#define SLUICE_ALGORITHM_LEAKY_BUCKET_H_

#include <cstdint>

#include "sluice/algorithm/token_bucket.h"

namespace sluice {

struct LeakyPoliceConfig : BucketConfig {
  static absl::StatusOr<LeakyPoliceConfig> Create(const BucketOptions& options);
};

struct LeakyPoliceState {
  int64_t level_ticks = 0;  // 0: empty, i.e. fresh
  int64_t last_us = 0;
};

Outcome<LeakyPoliceState> Decide(const LeakyPoliceConfig& config, LeakyPoliceState state, Time now,
                                 int64_t cost);
LeakyPoliceState Refund(const LeakyPoliceConfig& config, LeakyPoliceState state, Time taken_at,
                        int64_t cost);
Time FreshAt(const LeakyPoliceConfig& config, const LeakyPoliceState& state);

struct ShapeOptions {
  Rate rate;
  // Longest a request may be held. Default when neither this nor `queue` is
  // set: rate.period.
  Duration max_delay;
  // Most cost units waiting at once (0: bounded by max_delay only).
  int64_t queue = 0;
};

class LeakyShapeConfig {
 public:
  static absl::StatusOr<LeakyShapeConfig> Create(const ShapeOptions& options);

  const Rate& rate() const { return rate_; }
  const BucketRate& bucket_rate() const { return bucket_rate_; }
  Duration max_delay() const { return max_delay_; }
  int64_t queue() const { return queue_; }
  // Cost units that fit in the bound: the Decision's `limit`.
  int64_t capacity() const { return capacity_; }
  // The longest wait, in ticks, that max_delay and queue allow together.
  int64_t bound_ticks() const { return bound_ticks_; }

 private:
  Rate rate_;
  BucketRate bucket_rate_;
  Duration max_delay_;
  int64_t queue_ = 0;
  int64_t capacity_ = 0;
  int64_t bound_ticks_ = 0;
};

struct LeakyShapeState {
  int64_t next_free_ticks = 0;  // when the line is free again; <= now: empty
};

Outcome<LeakyShapeState> Decide(const LeakyShapeConfig& config, LeakyShapeState state, Time now,
                                int64_t cost);
// A departure slot once given is kept: giving it back could let two
// departures overlap if another request queued behind it meanwhile. Returns
// `state` unchanged; the limiter decides a shape limit last, so it never has
// to give one back.
LeakyShapeState Refund(const LeakyShapeConfig& config, LeakyShapeState state, Time taken_at,
                       int64_t cost);
Time FreshAt(const LeakyShapeConfig& config, const LeakyShapeState& state);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_LEAKY_BUCKET_H_
