// A fixed window's state packed in one word, for the memory store's tables
// of a limit whose counts leave room for the windows: window << count_bits |
// count. The table keeps the word in a one-word StateCell (read_gate.h),
// updated by one compare-and-swap. The packing is lossless: the algorithm
// decides on the very state it would have had. Internal.
#ifndef SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
#define SLUICE_STORE_MEMORY_PACKED_WINDOW_H_

#include <bit>
#include <cassert>
#include <cstdint>

#include "sluice/algorithm.h"

namespace sluice::internal {

// A packed table keeps the windows of times from the epoch up to this
// (2^55 us: the year 3111) and refuses other times.
inline constexpr int64_t kPackedTimeEndUs = int64_t{1} << 55;

// The bits of the largest count a fixed window's table may hold (the limit
// and kMaxDebtLimits limits of debt), or 0 when the windows up to
// kPackedTimeEndUs do not fit in the bits left: then it keeps two words.
inline int PackedCountBits(const FixedWindowConfig& config) {
  const auto max_count = static_cast<uint64_t>(config.limit()) * (1 + kMaxDebtLimits);
  const int count_bits = std::bit_width(max_count);
  const auto windows =
      static_cast<uint64_t>((kPackedTimeEndUs / config.period().micros()) + 2 * kMaxDebtLimits);
  return count_bits + std::bit_width(windows) <= 63 ? count_bits : 0;
}

inline uint64_t PackWindow(const FixedWindowState& state, int count_bits) {
  assert(state.window >= 0 && state.count >= 0 && (state.count >> count_bits) == 0);
  return (static_cast<uint64_t>(state.window) << count_bits) | static_cast<uint64_t>(state.count);
}

inline FixedWindowState UnpackWindow(uint64_t word, int count_bits) {
  return {.window = static_cast<int64_t>(word >> count_bits),
          .count = static_cast<int64_t>(word & ((uint64_t{1} << count_bits) - 1))};
}

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
