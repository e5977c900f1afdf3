// A window algorithm's state packed in one word, for the memory store's
// tables of a limit whose counts leave room for the windows: a fixed
// window's as w << count_bits | count, a sliding window's as
// (w + 2) << (prev_bits + count_bits) | prev << count_bits | curr, where w
// is the state's window less the table's first (`base`: the window of the
// time kPackedSpanUs / 2 before the table's first decision). The table
// keeps the word in a one-word StateCell (read_gate.h), updated by one
// compare-and-swap. The packing is lossless: the algorithm decides on the
// very state it would have had. Internal.
#ifndef SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
#define SLUICE_STORE_MEMORY_PACKED_WINDOW_H_

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <type_traits>

#include "algorithm/bucket_math.h"  // FloorDiv
#include "sluice/algorithm.h"

namespace sluice::internal {

// A packed table keeps the windows of the times within this span (2^52 us,
// about 142 years), half before its first decision's time and half after,
// and refuses other times. Counted from the table's first time rather than
// the epoch, the windows take 3 bits fewer than those up to the year 3111
// did, which the counts take instead (a fixed window of up to about 1
// million a second, a sliding window of up to 1,023 a second).
inline constexpr int64_t kPackedSpanUs = int64_t{1} << 52;

// The first window of a packed table of `period_us` whose first decision is
// at `first_us`: the window of the time kPackedSpanUs / 2 before it (a
// time beyond 2^62 us either way, some 146,000 years, taken as 2^62 us).
// The table keeps the times from that window's start, for kPackedSpanUs.
inline int64_t PackedBaseWindow(int64_t first_us, int64_t period_us) {
  constexpr int64_t kFar = int64_t{1} << 62;
  return FloorDiv(std::clamp(first_us, -kFar, kFar) - kPackedSpanUs / 2, period_us);
}

// How a table packs its states: the bits of a window's count (0: the
// states are not packed) and, for a sliding window, of the previous
// window's.
struct WindowPacking {
  int count_bits = 0;
  int prev_bits = 0;
};

// The packing of a window algorithm's states whose count holds the limit
// and kMaxDebtLimits limits of debt, beside a previous window's count of
// `prev_bits` (none for a fixed window) and the windows of kPackedSpanUs
// (two more: the span need not start or end on a window's edge) and
// `spare` more; none (count_bits 0) when they do not fit in 63 bits: the
// table then keeps the state's words.
inline WindowPacking PackingFor(const WindowConfig& config, int prev_bits, int64_t spare) {
  const int count_bits =
      std::bit_width(static_cast<uint64_t>(config.limit()) * (1 + kMaxDebtLimits));
  const auto windows = static_cast<uint64_t>(kPackedSpanUs / config.period().micros() + 2 + spare);
  if (count_bits + prev_bits + std::bit_width(windows) > 63) return {};
  return {.count_bits = count_bits, .prev_bits = prev_bits};
}

inline WindowPacking PackingOf(const FixedWindowConfig& config) {
  return PackingFor(config, 0, 2 * kMaxDebtLimits);
}

// A sliding window's previous count is at most the limit (the algorithm
// carries no more into it: window.cc, RollBy; a remembered key's state,
// StateUntil, has the limit there); its window is at least 2 before the
// table's first (a remembered key's, kept biased by 2) and at most
// kMaxDebtLimits past the windows of the span.
inline WindowPacking PackingOf(const SlidingWindowConfig& config) {
  return PackingFor(config, std::bit_width(static_cast<uint64_t>(config.limit())),
                    2 * kMaxDebtLimits + 2);
}

// `base`: the table's first window (PackedBaseWindow).
inline uint64_t PackWindow(const FixedWindowState& state, const WindowPacking& packing,
                           int64_t base) {
  const int count_bits = packing.count_bits;
  assert(state.window >= base && state.count >= 0 && (state.count >> count_bits) == 0);
  return (static_cast<uint64_t>(state.window - base) << count_bits) |
         static_cast<uint64_t>(state.count);
}

inline uint64_t PackWindow(const SlidingWindowState& state, const WindowPacking& packing,
                           int64_t base) {
  assert(state.window >= base - 2 && state.prev >= 0 && state.curr >= 0);
  assert((state.prev >> packing.prev_bits) == 0 && (state.curr >> packing.count_bits) == 0);
  return (static_cast<uint64_t>(state.window - base + 2)
          << (packing.prev_bits + packing.count_bits)) |
         (static_cast<uint64_t>(state.prev) << packing.count_bits) |
         static_cast<uint64_t>(state.curr);
}

template <typename State>
State UnpackWindow(uint64_t word, const WindowPacking& packing, int64_t base) {
  const uint64_t count_mask = (uint64_t{1} << packing.count_bits) - 1;
  if constexpr (std::is_same_v<State, FixedWindowState>) {
    return {.window = static_cast<int64_t>(word >> packing.count_bits) + base,
            .count = static_cast<int64_t>(word & count_mask)};
  } else {
    static_assert(std::is_same_v<State, SlidingWindowState>);
    const uint64_t prev = word >> packing.count_bits;
    return {.window = static_cast<int64_t>(prev >> packing.prev_bits) - 2 + base,
            .prev = static_cast<int64_t>(prev & ((uint64_t{1} << packing.prev_bits) - 1)),
            .curr = static_cast<int64_t>(word & count_mask)};
  }
}

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
