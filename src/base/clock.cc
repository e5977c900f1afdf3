#include "sluice/clock.h"

namespace sluice {

SystemClock::SystemClock()
    : steady_origin_(std::chrono::steady_clock::now()),
      unix_origin_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()) {}

Time SystemClock::Now() const {
  const auto since_origin = std::chrono::steady_clock::now() - steady_origin_;
  return Time::FromUnixMicros(
      unix_origin_us_ +
      std::chrono::duration_cast<std::chrono::microseconds>(since_origin).count());
}

const SystemClock& SystemClock::Default() {
  static const SystemClock clock;
  return clock;
}

}  // namespace sluice
