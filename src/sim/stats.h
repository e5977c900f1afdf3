// The simulator's measuring instruments. Internal; no allocation per sample
// except when a window grows past its largest size so far.
//
// RollingMax: the most events in any half-open interval of a fixed length,
//   exact, from times added in order (a ring of the times inside the window).
// Histogram: durations in log-linear buckets (64 per power of two, so a
//   percentile is within 1/64 of the true value, and exact below 64 us).
//
// Thread-safety: none.
//
//   sluice::sim::RollingMax per_second(sluice::Duration::Seconds(1));
//   per_second.Add(t);  // t never decreases
//   int64_t most = per_second.max();
#ifndef SLUICE_SIM_STATS_H_
#define SLUICE_SIM_STATS_H_

#include <array>
#include <bit>
#include <cstdint>
#include <vector>

#include "sluice/time.h"

namespace sluice::sim {

class RollingMax {
 public:
  explicit RollingMax(Duration window) : window_us_(window.micros()) {}

  // REQUIRES: t_us no earlier than the previous call's.
  void Add(int64_t t_us) {
    // The interval (t - window, t] holds the events still in the ring.
    while (size_ > 0 && ring_[head_] <= t_us - window_us_) {
      head_ = (head_ + 1) & (ring_.size() - 1);
      --size_;
    }
    if (size_ == ring_.size()) Grow();
    ring_[(head_ + size_) & (ring_.size() - 1)] = t_us;
    ++size_;
    if (static_cast<int64_t>(size_) > max_) max_ = static_cast<int64_t>(size_);
  }
  int64_t max() const { return max_; }

 private:
  void Grow() {
    std::vector<int64_t> bigger(ring_.empty() ? 8 : ring_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
    ring_.swap(bigger);
    head_ = 0;
  }

  int64_t window_us_;
  std::vector<int64_t> ring_;  // a power of two long
  size_t head_ = 0;
  size_t size_ = 0;
  int64_t max_ = 0;
};

class Histogram {
 public:
  void Add(Duration d) {
    const int64_t us = d.micros() < 0 ? 0 : d.micros();
    ++counts_[Index(us)];
    ++total_;
    if (us > max_us_) max_us_ = us;
  }
  int64_t count() const { return total_; }
  Duration max() const { return Duration::Micros(max_us_); }

  // The smallest bucket bound below which at least `fraction` of the samples
  // lie (capped at the largest sample); 0 without samples.
  Duration Percentile(double fraction) const {
    if (total_ == 0) return Duration::Zero();
    int64_t need = static_cast<int64_t>(fraction * static_cast<double>(total_) + 0.999999);
    if (need < 1) need = 1;
    int64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= need) {
        const int64_t bound = UpperBound(i);
        return Duration::Micros(bound < max_us_ ? bound : max_us_);
      }
    }
    return max();
  }

 private:
  static constexpr int kSubBits = 6;  // 64 buckets per power of two
  static constexpr int64_t kSub = int64_t{1} << kSubBits;

  static size_t Index(int64_t us) {
    if (us < kSub) return static_cast<size_t>(us);
    const int exponent = 63 - std::countl_zero(static_cast<uint64_t>(us));  // >= kSubBits
    const int shift = exponent - kSubBits;
    const int64_t mantissa = (us >> shift) - kSub;  // [0, kSub)
    return static_cast<size_t>(kSub + (shift * kSub) + mantissa);
  }
  static int64_t UpperBound(size_t index) {
    if (index < static_cast<size_t>(kSub)) return static_cast<int64_t>(index);
    const int64_t shift = (static_cast<int64_t>(index) - kSub) / kSub;
    const int64_t mantissa = (static_cast<int64_t>(index) - kSub) % kSub;
    return ((kSub + mantissa + 1) << shift) - 1;
  }

  std::array<int64_t, kSub + (64 - kSubBits) * kSub> counts_{};
  int64_t total_ = 0;
  int64_t max_us_ = 0;
};

}  // namespace sluice::sim

#endif  // SLUICE_SIM_STATS_H_
