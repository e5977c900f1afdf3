// A fixed window's state packed in one word, for the memory store's
// tables of a limit whose counts leave room for the windows. Internal.
//
// Thread-safety: PackedWindowCell::Update from any thread (a
// compare-and-swap of the word); Get only where nobody updates it.
#ifndef SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
#define SLUICE_STORE_MEMORY_PACKED_WINDOW_H_

#include <atomic>
#include <bit>
#include <cassert>
#include <cstdint>

#include "sluice/algorithm.h"
#include "sluice/decision.h"

namespace sluice::internal {

// A fixed window's state, (window, count), packed into one word when the
// table's limit leaves room: window << count_bits | count, both within
// their bits (PackedCountBits), updated by one compare-and-swap like a
// one-word state. The packing is lossless: the algorithm decides on the
// very state it would have had.
class PackedWindowCell {
 public:
  PackedWindowCell(const FixedWindowState& state, int count_bits)
      : word_(Pack(state, count_bits)) {}
  PackedWindowCell(PackedWindowCell&& other) noexcept
      : word_(std::atomic_ref<uint64_t>(other.word_).load(std::memory_order_relaxed)) {}

  template <typename Step>
  Decision Update(int count_bits, Step step) {
    std::atomic_ref<uint64_t> word(word_);
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      FixedWindowState state = Unpack(seen, count_bits);
      Decision d = step(state);
      const uint64_t next = Pack(state, count_bits);
      if (next == seen) return d;
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
        return d;
      }
    }
  }
  FixedWindowState Get(int count_bits) const { return Unpack(word_, count_bits); }

  static uint64_t Pack(const FixedWindowState& state, int count_bits) {
    assert(state.window >= 0 && state.count >= 0 && (state.count >> count_bits) == 0);
    return (static_cast<uint64_t>(state.window) << count_bits) | static_cast<uint64_t>(state.count);
  }
  static FixedWindowState Unpack(uint64_t word, int count_bits) {
    return {.window = static_cast<int64_t>(word >> count_bits),
            .count = static_cast<int64_t>(word & ((uint64_t{1} << count_bits) - 1))};
  }

 private:
  uint64_t word_;
};

// Where a fixed window's table may keep its states packed (PackedWindowCell):
// the bits of its largest count (the limit and kMaxDebtLimits limits of
// debt), or 0 when the windows of every time from the epoch to 2^55 us (the
// year 3111) do not fit in the bits left.
inline int PackedCountBits(const FixedWindowConfig& config) {
  const auto max_count = static_cast<uint64_t>(config.limit()) * (1 + kMaxDebtLimits);
  const int count_bits = std::bit_width(max_count);
  const auto windows =
      static_cast<uint64_t>(((int64_t{1} << 55) / config.period().micros()) + 2 * kMaxDebtLimits);
  return count_bits + std::bit_width(windows) <= 63 ? count_bits : 0;
}

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_PACKED_WINDOW_H_
