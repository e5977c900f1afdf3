// Rng: the simulator's randomness, the same numbers for a seed on every
// platform. Internal to the simulator.
//
// std::mt19937_64 is specified bit for bit by the standard, but the std::
// distributions are not (libstdc++ and libc++ draw differently), so the few
// distributions the simulator needs are written here on top of the raw
// 64-bit draws. Exponential draws go through std::log, which glibc rounds
// correctly, so a seed gives the same output for a given build everywhere.
//
// Thread-safety: none; one Rng per stream.
//
//   sluice::sim::Rng rng(sluice::sim::Rng::Stream(seed, 3));
//   double gap_us = rng.Exponential(25'000.0);
#ifndef SLUICE_SIM_RANDOM_H_
#define SLUICE_SIM_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace sluice::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  // An independent seed for stream `stream` of a run seeded with `seed`
  // (splitmix64 of both): each traffic source, the server's jitter and the
  // clients' jitter draw from their own stream, so the offered traffic is the
  // same for every limiter compared, whatever the retries do.
  static uint64_t Stream(uint64_t seed, uint64_t stream) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (stream + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  uint64_t Next() { return engine_(); }

  // Uniform in [0, 1), 53 random bits.
  double Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform in [0, n); 0 when n == 0. Lemire's multiply-shift: the bias is
  // below 2^-40 for any n the simulator uses.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

  // Uniform in [0, max], inclusive; 0 when max <= 0.
  int64_t UpTo(int64_t max) {
    return max <= 0 ? 0 : static_cast<int64_t>(Below(static_cast<uint64_t>(max) + 1));
  }

  // Exponentially distributed with the given mean (a Poisson process's gap).
  double Exponential(double mean) { return -mean * std::log1p(-Uniform01()); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace sluice::sim

#endif  // SLUICE_SIM_RANDOM_H_
