// The simulator's measuring instruments. Internal; no allocation per sample
// except when a window grows past its largest size so far.
//
// RollingMax: the most events in any half-open interval of a fixed length,
//   exact, from times added in order (a ring of the times inside the window,
//   each kept as its distance from the one before in a byte or more).
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

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "sluice/time.h"

namespace sluice::sim {

class RollingMax {
 public:
  explicit RollingMax(Duration window) : window_us_(window.micros()) {}

  // REQUIRES: t_us no earlier than the previous call's.
  void Add(int64_t t_us) {
    // The interval (t - window, t] holds the events still in the ring.
    while (count_ > 0 && head_us_ <= t_us - window_us_) Pop();
    if (used_ + kMaxBytes > capacity_) Grow();
    const auto delta = static_cast<uint64_t>(t_us - last_us_);
    last_us_ = t_us;
    const size_t at = (head_ + used_) & (capacity_ - 1);
    const size_t bytes = Put(at, delta);
    used_ += bytes;
    if (count_ == 0) {
      head_us_ = t_us;
      head_bytes_ = bytes;
    }
    if (static_cast<int64_t>(++count_) > max_) max_ = static_cast<int64_t>(count_);
  }
  int64_t max() const { return max_; }

 private:
  // A time is kept as its distance from the one before, in 7-bit groups
  // (low first, the high bit set on all but the last byte): a byte or two
  // an event where events are dense, which is where a window holds many.
  static constexpr size_t kMaxBytes = 10;

  size_t Put(size_t at, uint64_t delta) {
    size_t n = 0;
    while (delta >= 0x80) {
      ring_[(at + n++) & (capacity_ - 1)] = static_cast<uint8_t>(delta | 0x80);
      delta >>= 7;
    }
    ring_[(at + n++) & (capacity_ - 1)] = static_cast<uint8_t>(delta);
    return n;
  }
  // The distance stored at `at`, and how many bytes it takes.
  uint64_t Get(size_t at, size_t& bytes) const {
    uint64_t delta = 0;
    int shift = 0;
    bytes = 0;
    while (true) {
      const uint8_t b = ring_[(at + bytes++) & (capacity_ - 1)];
      delta |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return delta;
      shift += 7;
    }
  }
  void Pop() {
    head_ = (head_ + head_bytes_) & (capacity_ - 1);
    used_ -= head_bytes_;
    if (--count_ > 0) head_us_ += static_cast<int64_t>(Get(head_, head_bytes_));
  }
  void Grow() {
    const size_t bigger = capacity_ == 0 ? 64 : capacity_ * 2;
    // Not value-initialized: a byte is read only after it was written.
    std::unique_ptr<uint8_t[]> ring(new uint8_t[bigger]);
    if (used_ > 0) {
      const size_t first = std::min(used_, capacity_ - head_);  // up to the ring's end
      std::memcpy(ring.get(), ring_.get() + head_, first);
      std::memcpy(ring.get() + first, ring_.get(), used_ - first);
    }
    ring_ = std::move(ring);
    capacity_ = bigger;
    head_ = 0;
  }

  int64_t window_us_;
  std::unique_ptr<uint8_t[]> ring_;  // capacity_ bytes, a power of two
  size_t capacity_ = 0;
  size_t head_ = 0;        // the oldest event's bytes
  size_t used_ = 0;        // bytes from head_
  size_t head_bytes_ = 0;  // the oldest event's byte count
  size_t count_ = 0;       // events in the ring
  int64_t head_us_ = 0;    // the oldest event's time
  int64_t last_us_ = 0;    // the newest event's time
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
