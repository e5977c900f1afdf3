// leaky_bucket mode shape: the departures it schedules (now + delay) are
// never faster than the rate, waits stay within max_delay and the queue, and
// a request is rejected exactly when it would not fit.
//
// A request of cost c is released at once, at its departure, and occupies c
// departure slots (c/rate) of the line. Departures are whole microseconds,
// rounded up from exact slot times, so two consecutive unit departures can
// be floor(1/rate) apart (83333us at 3/250ms) while the long-run spacing is
// exact. The precise statement tested: for departures i < j (in admission
// order), the cost released from i up to (not including) j is less than
// rate * (dep_j - dep_i + 1us). For unit costs it gives: any half-open
// interval of D microseconds holds at most ceil(D * rate) <= 1 + floor(D *
// rate) departures.
#include <algorithm>
#include <cstdint>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/reference_models.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

using Shape = Algo<LeakyShapeConfig>;

constexpr uint64_t kLeakyShapeSeeds[] = {301, 302, 303};

LeakyShapeConfig MakeShape(std::string_view rate, Duration max_delay, int64_t queue = 0) {
  absl::StatusOr<LeakyShapeConfig> config = LeakyShapeConfig::Create(
      {.rate = MustParseRate(rate), .max_delay = max_delay, .queue = queue});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

struct Departure {
  Time decided;
  Time at;  // decided + delay
  int64_t cost;
};

// Runs `trace` through a fresh shaper and returns the admitted requests'
// departures (cost 0 peeks take no slot and are left out), checking the
// per-decision bounds on the way: delay within max_delay, waiting cost
// within the queue.
std::vector<Departure> Departures(const LeakyShapeConfig& config,
                                  const std::vector<Request>& trace) {
  LeakyShapeState state;
  std::vector<Departure> departures;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Request& r = trace[i];
    const Decision d = Shape::Step(config, state, r.at, r.cost);
    if (!d.allowed) continue;
    if (config.max_delay() > Duration::Zero()) {
      EXPECT_LE(d.delay, config.max_delay()) << "step " << i;
    }
    if (r.cost == 0) continue;
    departures.push_back({r.at, r.at + d.delay, r.cost});
    if (config.queue() > 0) {
      // Cost admitted and not yet departed, this request included.
      int64_t waiting = 0;
      for (auto it = departures.rbegin(); it != departures.rend() && it->at > r.at; ++it) {
        waiting += it->cost;
      }
      EXPECT_LE(waiting, config.queue()) << "step " << i << " at " << TimeString(r.at);
    }
  }
  return departures;
}

// The spacing rules, at the configured rate.
void ExpectSpacedAtRate(const Rate& rate, const std::vector<Departure>& departures) {
  const i128 limit = rate.limit, period = rate.period.micros();
  // For each j: max over i < j of dep_i * limit - prefix(i) * period, where
  // prefix(i) is the cost admitted before i.
  i128 prefix = 0;
  i128 best = 0;
  for (size_t j = 0; j < departures.size(); ++j) {
    const Departure& d = departures[j];
    const i128 dep = d.at.unix_micros();
    if (j > 0) {
      const Departure& prev = departures[j - 1];
      ASSERT_GE(d.at, prev.at) << "departure " << j << " overtakes the one before it";
      // Consecutive departures at least floor(cost / rate) apart.
      ASSERT_GE(static_cast<i128>((d.at - prev.at).micros()), prev.cost * period / limit)
          << "departure " << j;
      // (dep_j - dep_i + 1) * limit > (prefix(j) - prefix(i)) * period for all i < j.
      ASSERT_GT((dep + 1) * limit - prefix * period, best)
          << "departure " << j << " at " << TimeString(d.at) << ": released faster than the rate";
    }
    const i128 key = dep * limit - prefix * period;
    if (j == 0 || key > best) best = key;
    prefix += d.cost;
  }
}

// Random costs 0..3 (and at / above capacity) at 3x the rate: departures
// keep their order, are never closer than the rate allows, delays stay
// within max_delay and waiting cost within the queue.
TEST(LeakyShapeTest, DeparturesAreNeverFasterThanTheRate) {
  for (const NamedConfig<LeakyShapeConfig>& c : ConfigsOf<LeakyShapeConfig>()) {
    const LeakyShapeConfig& config = c.config;
    for (uint64_t seed : kLeakyShapeSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      TraceOptions options;
      options.rate = config.rate();
      options.capacity = config.capacity();
      options.steps = 3000;
      options.load = 3;
      const std::vector<Departure> departures = Departures(config, RandomTrace(seed, options));
      ASSERT_GT(departures.size(), 100u);
      ExpectSpacedAtRate(config.rate(), departures);
      if (HasFatalFailure()) return;
    }
  }
}

// Unit costs, Poisson at 3x the rate: any half-open interval of D
// microseconds holds at most 1 + floor(D * rate) departures (in fact at most
// ceil(D * rate)), for D from 1us to ten periods.
TEST(LeakyShapeTest, UnitDeparturesInAnyIntervalOfLengthDAreAtMostOnePlusDTimesRate) {
  for (const NamedConfig<LeakyShapeConfig>& c : ConfigsOf<LeakyShapeConfig>()) {
    const LeakyShapeConfig& config = c.config;
    const Rate rate = config.rate();
    const int64_t period = rate.period.micros();
    for (uint64_t seed : kLeakyShapeSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      const std::vector<Departure> departures =
          Departures(config, PoissonTrace(seed, rate, 3.0, 3000));
      // (At 2000/us every arrival falls in one microsecond: only `capacity` fit.)
      ASSERT_GE(departures.size(), std::min<size_t>(100, config.capacity()));
      const int64_t interval = std::max<int64_t>(1, period / rate.limit);
      for (const int64_t length :
           {int64_t{1}, interval, interval + 1, 2 * interval + interval / 2, period, 10 * period}) {
        const i128 ceil_bound =
            (static_cast<i128>(length) * rate.limit + period - 1) / period;  // ceil(D * rate)
        const i128 floor_bound = 1 + static_cast<i128>(length) * rate.limit / period;
        size_t first = 0;
        for (size_t last = 0; last < departures.size(); ++last) {
          while (departures[last].at - departures[first].at >= Duration::Micros(length)) ++first;
          const i128 count = static_cast<i128>(last - first + 1);
          ASSERT_LE(count, floor_bound)
              << "D=" << length << "us ending at " << TimeString(departures[last].at);
          ASSERT_LE(count, std::max<i128>(1, ceil_bound)) << "D=" << length << "us";
        }
      }
    }
  }
}

// 10/s with max_delay 1s: eleven requests at one instant get delays 0,
// 100ms, ..., 1s; the twelfth would wait 1.1s and is rejected, told to retry
// when its wait fits (100ms later); nothing is ever delayed past max_delay.
TEST(LeakyShapeEdgeTest, RejectsExactlyWhenTheWaitWouldExceedMaxDelay) {
  const LeakyShapeConfig config = MakeShape("10/s", Duration::Seconds(1));
  EXPECT_EQ(config.capacity(), 11);
  LeakyShapeState state;
  const Time t0 = kTraceOrigin;
  for (int k = 0; k <= 10; ++k) {
    const Decision d = Shape::Step(config, state, t0, 1);
    ASSERT_TRUE(d.allowed) << k;
    EXPECT_EQ(d.delay, Duration::Millis(100 * k));
    EXPECT_EQ(d.remaining, 10 - k);
  }
  const Decision rejected = Shape::Step(config, state, t0, 1);
  EXPECT_FALSE(rejected.allowed);
  EXPECT_EQ(rejected.retry_after, Duration::Millis(100));
  EXPECT_EQ(rejected.reset_after, Duration::Millis(1100));
  // A cost of 2 needs its second unit within the bound too.
  EXPECT_FALSE(Shape::Step(config, state, t0 + Duration::Millis(100), 2).allowed);
  const Decision later = Shape::Step(config, state, t0 + Duration::Millis(100), 1);
  EXPECT_TRUE(later.allowed);
  EXPECT_EQ(later.delay, Duration::Seconds(1));
  EXPECT_TRUE(Shape::Step(config, state, t0, 12).can_never_pass());
}

// 10/s with queue 3 (no max_delay): one request leaves at once and three
// wait; a fifth does not fit until the line moves.
TEST(LeakyShapeEdgeTest, QueueBoundsTheCostWaitingAtOnce) {
  const LeakyShapeConfig config = MakeShape("10/s", Duration::Zero(), 3);
  EXPECT_EQ(config.capacity(), 4);
  LeakyShapeState state;
  const Time t0 = kTraceOrigin;
  for (int k = 0; k < 4; ++k) {
    const Decision d = Shape::Step(config, state, t0, 1);
    ASSERT_TRUE(d.allowed) << k;
    EXPECT_EQ(d.delay, Duration::Millis(100 * k));
  }
  const Decision rejected = Shape::Step(config, state, t0 + Duration::Millis(50), 1);
  EXPECT_FALSE(rejected.allowed);
  EXPECT_EQ(rejected.retry_after, Duration::Millis(50));
  const Decision fits = Shape::Step(config, state, t0 + Duration::Millis(100), 1);
  EXPECT_TRUE(fits.allowed);
  EXPECT_EQ(fits.delay, Duration::Millis(300));
}

// Under constant overload the line never idles: at 3/250ms the gaps between
// departures are 83333us or 83334us, and N gaps span exactly
// ceil-to-the-microsecond N * 250ms / 3.
TEST(LeakyShapeEdgeTest, OverloadedLineDepartsExactlyAtRateWithoutDrift) {
  const LeakyShapeConfig config = MakeShape("3/250ms", Duration::Seconds(2));
  LeakyShapeState state;
  const Time t0 = kTraceOrigin;
  std::vector<Time> departures;
  for (Time t = t0; t < t0 + Duration::Seconds(60); t += Duration::Millis(1)) {
    const Decision d = Shape::Step(config, state, t, 1);
    if (d.allowed) departures.push_back(t + d.delay);
  }
  ASSERT_GT(departures.size(), 700u);
  for (size_t k = 1; k < departures.size(); ++k) {
    const int64_t gap = (departures[k] - departures[k - 1]).micros();
    ASSERT_TRUE(gap == 83333 || gap == 83334) << "gap " << gap << " before departure " << k;
    // Slot k starts exactly k * 250000/3 us after the first.
    ASSERT_EQ((departures[k] - departures[0]).micros(), (static_cast<int64_t>(k) * 250000 + 2) / 3);
  }
}

// The largest queue Create accepts, at the fastest exact rate (2048 ticks per
// microsecond), in 2070 and with the clock stepping back to 1970: the wait
// arithmetic must not overflow (UBSan traps if it does), and the line must
// still refuse what does not fit.
TEST(LeakyShapeEdgeTest, LargestValidQueueDoesNotOverflowIn2070) {
  const Rate rate = MustParseRate("2048/us");
  int64_t lo = 1, hi = int64_t{1} << 62;  // lo accepted, hi refused
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (LeakyShapeConfig::Create({.rate = rate, .max_delay = Duration::Zero(), .queue = mid}).ok()
         ? lo
         : hi) = mid;
  }
  const LeakyShapeConfig config = MakeShape("2048/us", Duration::Zero(), lo);
  const int64_t capacity = config.capacity();
  for (const Time start : {kTraceOrigin, kYear2070}) {
    SCOPED_TRACE(TimeString(start));
    LeakyShapeState state;
    const Decision first = Shape::Step(config, state, start, capacity);
    ASSERT_TRUE(first.allowed);
    EXPECT_EQ(first.delay, Duration::Zero());
    // The line is now `capacity` slots long: a second full request must wait
    // for all of it and is refused.
    const Decision second = Shape::Step(config, state, start, capacity);
    EXPECT_FALSE(second.allowed);
    EXPECT_GT(second.retry_after, Duration::Zero());
    EXPECT_FALSE(second.retry_after.IsInfinite());
    const Decision unit = Shape::Step(config, state, start, 1);
    EXPECT_FALSE(unit.allowed);
    const Decision back = Shape::Step(config, state, kNearEpoch, capacity);
    EXPECT_FALSE(back.allowed);
    EXPECT_GT(back.retry_after, Duration::Zero());
    EXPECT_EQ(kNearEpoch + back.reset_after, start + first.reset_after);
  }
}

}  // namespace
}  // namespace sluice::conformance
