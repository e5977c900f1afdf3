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

CoarseClock::CoarseClock(Duration refresh, const Clock& source)
    : source_(source),
      refresh_(refresh > Duration::Zero() ? refresh : Duration::Micros(1)),
      now_us_(source.Now().unix_micros()) {
  ticker_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::microseconds(refresh_.micros()));
      Tick();
    }
  });
}

CoarseClock::~CoarseClock() {
  stop_.store(true, std::memory_order_relaxed);
  ticker_.join();
}

void CoarseClock::Tick() {
  // Forward only: the source is monotonic, but a ManualClock source (tests)
  // may be set back.
  const int64_t now = source_.Now().unix_micros();
  if (now > now_us_.load(std::memory_order_relaxed)) {
    now_us_.store(now, std::memory_order_relaxed);
  }
}

}  // namespace sluice
