// A window algorithm's state packed in one word, for the memory store's
// tables of a limit whose counts leave room for the windows: a fixed
// window's as window << count_bits | count, a sliding window's as
// (window + 2) << (prev_bits + count_bits) | prev << count_bits | curr. The
// table keeps the word in a one-word StateCell (read_gate.h), updated by one
// compare-and-swap. The packing is lossless: the algorithm decides on the
// very state it would have had. Internal.
#ifndef SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
#define SLUICE_STORE_MEMORY_PACKED_WINDOW_H_

#include <bit>
#include <cassert>
#include <cstdint>
#include <type_traits>

#include "sluice/algorithm.h"

namespace sluice::internal {

// A packed table keeps the windows of times from the epoch up to this
// (2^55 us: the year 3111) and refuses other times.
inline constexpr int64_t kPackedTimeEndUs = int64_t{1} << 55;

// How a table packs its states: the bits of a window's count (0: the
// states are not packed) and, for a sliding window, of the previous
// window's.
struct WindowPacking {
  int count_bits = 0;
  int prev_bits = 0;
};

// The packing of a window algorithm's states whose count holds the limit
// and kMaxDebtLimits limits of debt, beside a previous window's count of
// `prev_bits` (none for a fixed window) and the windows up to
// kPackedTimeEndUs and `spare` more; none (count_bits 0) when they do not
// fit in 63 bits: the table then keeps the state's words.
inline WindowPacking PackingFor(const WindowConfig& config, int prev_bits, int64_t spare) {
  const int count_bits =
      std::bit_width(static_cast<uint64_t>(config.limit()) * (1 + kMaxDebtLimits));
  const auto windows = static_cast<uint64_t>(kPackedTimeEndUs / config.period().micros() + spare);
  if (count_bits + prev_bits + std::bit_width(windows) > 63) return {};
  return {.count_bits = count_bits, .prev_bits = prev_bits};
}

inline WindowPacking PackingOf(const FixedWindowConfig& config) {
  return PackingFor(config, 0, 2 * kMaxDebtLimits);
}

// A sliding window's previous count is at most the limit (the algorithm
// carries no more into it: window.cc, RollBy; a remembered key's state,
// StateUntil, has the limit there); its window is at least -2 (a
// remembered key's, kept biased by 2) and at most kMaxDebtLimits past the
// windows up to kPackedTimeEndUs.
inline WindowPacking PackingOf(const SlidingWindowConfig& config) {
  return PackingFor(config, std::bit_width(static_cast<uint64_t>(config.limit())),
                    2 * kMaxDebtLimits + 2);
}

inline uint64_t PackWindow(const FixedWindowState& state, const WindowPacking& packing) {
  const int count_bits = packing.count_bits;
  assert(state.window >= 0 && state.count >= 0 && (state.count >> count_bits) == 0);
  return (static_cast<uint64_t>(state.window) << count_bits) | static_cast<uint64_t>(state.count);
}

inline uint64_t PackWindow(const SlidingWindowState& state, const WindowPacking& packing) {
  assert(state.window >= -2 && state.prev >= 0 && state.curr >= 0);
  assert((state.prev >> packing.prev_bits) == 0 && (state.curr >> packing.count_bits) == 0);
  return (static_cast<uint64_t>(state.window + 2) << (packing.prev_bits + packing.count_bits)) |
         (static_cast<uint64_t>(state.prev) << packing.count_bits) |
         static_cast<uint64_t>(state.curr);
}

template <typename State>
State UnpackWindow(uint64_t word, const WindowPacking& packing) {
  const uint64_t count_mask = (uint64_t{1} << packing.count_bits) - 1;
  if constexpr (std::is_same_v<State, FixedWindowState>) {
    return {.window = static_cast<int64_t>(word >> packing.count_bits),
            .count = static_cast<int64_t>(word & count_mask)};
  } else {
    static_assert(std::is_same_v<State, SlidingWindowState>);
    const uint64_t prev = word >> packing.count_bits;
    return {.window = static_cast<int64_t>(prev >> packing.prev_bits) - 2,
            .prev = static_cast<int64_t>(prev & ((uint64_t{1} << packing.prev_bits) - 1)),
            .curr = static_cast<int64_t>(word & count_mask)};
  }
}

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
