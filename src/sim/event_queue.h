// The simulator's pending events, taken in order of (time_us, seq): a
// calendar. Internal.
//
// A simulation never schedules into its past, so the events it holds lie
// mostly a little ahead of the one it runs. A binary heap of them all pays
// its depth, and a cache miss a level once it outgrows the cache, twice per
// event (a shaping leaky bucket holds every admitted request for up to its
// delay: 50,000 of them at 500k admitted a second and 100 ms). Here:
//
//   run    the events of the current bucket (128 us of time), sorted when
//          it becomes current (stable, by the microsecond: an insertion sort
//          of a few events, a counting sort of more),
//          and a small heap of those pushed to it since;
//   wheel  the next kBuckets - 1 buckets, each a vector in the order its
//          events came, with a bitmap of the ones that hold any, so the
//          next is found a 64-bit word at a time;
//   far    the rest, a binary heap, moved into the wheel as it comes within
//          reach.
//
// Ties keep their order: a bucket's vector holds the events of one time in
// the order they were pushed (those moved from far come first, and were
// pushed first), the sort is stable, and the run goes before the heap of
// later pushes at equal times. Vectors keep their capacity, a drained
// bucket's passing to the next bucket to fill: in steady traffic a push and
// a pop allocate nothing.
//
// Thread-safety: none.
//
//   EventQueue<Event> q;  // Event has int64_t time_us and uint64_t seq
//   q.Push(e);            // e.time_us >= the last popped event's
//   while (!q.empty()) Run(q.Pop());
#ifndef SLUICE_SIM_EVENT_QUEUE_H_
#define SLUICE_SIM_EVENT_QUEUE_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::sim {

template <typename Event>
class EventQueue {
 public:
  // REQUIRES: e.time_us no earlier than the last popped event's, and e.seq
  // above every seq pushed before.
  void Push(const Event& e) {
    ++size_;
    const int64_t b = BucketOf(e);
    if (b <= current_) {
      late_.push_back(e);
      std::push_heap(late_.begin(), late_.end(), Later);
    } else if (b < current_ + static_cast<int64_t>(kBuckets)) {
      ToWheel(b, e);
    } else {
      far_.push_back(e);
      std::push_heap(far_.begin(), far_.end(), Later);
    }
  }

  // REQUIRES: !empty().
  Event Pop() {
    if (next_ == run_.size() && late_.empty()) Advance();
    --size_;
    // Of equal times the run's comes first: it was pushed before.
    if (late_.empty() || (next_ < run_.size() && run_[next_].time_us <= late_.front().time_us)) {
      return run_[next_++];
    }
    std::pop_heap(late_.begin(), late_.end(), Later);
    Event e = late_.back();
    late_.pop_back();
    return e;
  }

  // Whether `e`, pushed now, would be the next popped: then it can be run
  // at once instead. False may also mean "not known without looking further".
  bool Before(const Event& e) const {
    if (next_ < run_.size()) return e.time_us < run_[next_].time_us && Ahead(e);
    if (!late_.empty()) return Ahead(e);
    return size_ == 0 || BucketOf(e) <= current_;  // the rest are in later buckets
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

 private:
  static constexpr int kWidthBits = 7;  // 128 us a bucket
  static constexpr int64_t kWidth = int64_t{1} << kWidthBits;
  static constexpr size_t kBuckets = 4096;
  static constexpr size_t kMask = kBuckets - 1;
  // The most events a bucket's insertion sort takes; more, and the counting
  // sort's pass over the bucket's 128 microseconds costs less.
  static constexpr size_t kInsertionMax = 16;

  // The later of two events: the top of a heap ordered by it is the earliest.
  static bool Later(const Event& a, const Event& b) {
    return a.time_us != b.time_us ? a.time_us > b.time_us : a.seq > b.seq;
  }
  static int64_t BucketOf(const Event& e) { return e.time_us >> kWidthBits; }
  bool Ahead(const Event& e) const { return late_.empty() || Later(late_.front(), e); }

  void ToWheel(int64_t b, const Event& e) {
    const auto slot = static_cast<size_t>(b) & kMask;
    std::vector<Event>& bucket = wheel_[slot];
    if (bucket.capacity() == 0 && !spare_.empty()) {
      bucket.swap(spare_.back());
      spare_.pop_back();
    }
    bucket.push_back(e);
    occupied_[slot / 64] |= uint64_t{1} << (slot % 64);
    ++in_wheel_;
  }

  // The wheel's next bucket that holds events, after the current one.
  // REQUIRES: in_wheel_ > 0.
  int64_t NextInWheel() const {
    const auto from = static_cast<size_t>(current_ + 1) & kMask;
    size_t word = from / 64;
    uint64_t bits = occupied_[word] & (~uint64_t{0} << (from % 64));
    while (bits == 0) {
      word = (word + 1) % occupied_.size();
      bits = occupied_[word];
    }
    const size_t slot = word * 64 + static_cast<size_t>(std::countr_zero(bits));
    return current_ + 1 + static_cast<int64_t>((slot - from) & kMask);
  }

  // Makes the next bucket that holds events the current one, its events
  // the run in order.
  // REQUIRES: the run spent, late_ empty, size_ > 0.
  void Advance() {
    current_ = in_wheel_ > 0 ? NextInWheel() : BucketOf(far_.front());
    // Into the wheel in (time, seq) order. A bucket comes within reach
    // here before anything can be pushed to it directly, and what is pushed
    // later has a higher seq: so a bucket's events of one time are in the
    // order of seq.
    while (!far_.empty() && BucketOf(far_.front()) < current_ + static_cast<int64_t>(kBuckets)) {
      std::pop_heap(far_.begin(), far_.end(), Later);
      const Event e = far_.back();
      far_.pop_back();
      ToWheel(BucketOf(e), e);
    }
    const auto slot = static_cast<size_t>(current_) & kMask;
    std::vector<Event>& bucket = wheel_[slot];
    // A stable sort by the microsecond within the bucket: in order of time,
    // and of seq among equal times.
    if (bucket.size() <= kInsertionMax) {
      // Few events (most buckets of a quiet stretch hold one or two): an
      // insertion sort, which moves an event only past later times.
      run_.clear();
      for (const Event& e : bucket) {
        run_.push_back(e);
        size_t i = run_.size() - 1;
        for (; i > 0 && run_[i - 1].time_us > e.time_us; --i) run_[i] = run_[i - 1];
        run_[i] = e;
      }
    } else {
      // A counting sort: linear in the events, and in the bucket's width.
      std::array<uint32_t, kWidth + 1> at{};
      for (const Event& e : bucket) ++at[static_cast<size_t>(e.time_us & (kWidth - 1)) + 1];
      for (size_t i = 1; i <= kWidth; ++i) at[i] += at[i - 1];
      run_.resize(bucket.size());
      for (const Event& e : bucket) run_[at[static_cast<size_t>(e.time_us & (kWidth - 1))]++] = e;
    }
    next_ = 0;
    in_wheel_ -= bucket.size();
    bucket.clear();
    spare_.emplace_back().swap(bucket);
    occupied_[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }

  std::vector<Event> run_;   // the current bucket's events, in order
  size_t next_ = 0;          // the run's next
  std::vector<Event> late_;  // pushed to the current bucket since it became current
  std::array<std::vector<Event>, kBuckets> wheel_;
  std::array<uint64_t, kBuckets / 64> occupied_{};
  // Drained buckets' vectors, for the next buckets to fill: the wheel keeps
  // room for the events it holds at once, not for every bucket's busiest.
  std::vector<std::vector<Event>> spare_;
  std::vector<Event> far_;
  int64_t current_ = INT64_MIN;  // nothing popped yet: every event is ahead
  size_t in_wheel_ = 0;
  size_t size_ = 0;
};

}  // namespace sluice::sim

#endif  // SLUICE_SIM_EVENT_QUEUE_H_
