// The bucket algorithms: token_bucket's guarantee, gcra and leaky_bucket
// police as the same meter, and exact (drift-free) arithmetic at fractional
// and very slow rates.
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/reference_models.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

constexpr uint64_t kBucketSeeds[] = {201, 202, 203};

// Checks that over every interval [t_i, t_j] between two admitted requests
// the admitted cost is at most burst + rate * (t_j - t_i), at the configured
// (exact) rate. The worst interval ending at j starts at the i <= j
// minimising prefix(i-1) * period - limit * t_i, so one pass suffices.
void ExpectAtMostBurstPlusRateTimesT(const Rate& rate, int64_t burst,
                                     const std::vector<Request>& admitted) {
  const i128 period = rate.period.micros(), limit = rate.limit;
  i128 prefix = 0;  // admitted cost before the current request
  i128 best_start = 0;
  for (size_t j = 0; j < admitted.size(); ++j) {
    const Request& r = admitted[j];
    const i128 start_key = prefix * period - limit * r.at.unix_micros();
    if (j == 0 || start_key < best_start) best_start = start_key;
    prefix += r.cost;
    // (prefix(j) - prefix(i-1)) * period - limit * (t_j - t_i) <= burst * period
    const i128 excess = prefix * period - limit * r.at.unix_micros() - best_start;
    ASSERT_LE(excess, static_cast<i128>(burst) * period)
        << "more than burst + rate*T admitted in an interval ending at " << TimeString(r.at);
  }
}

template <typename Config>
class BucketTest : public testing::Test {};

TYPED_TEST_SUITE(BucketTest, BucketConfigTypes, AlgorithmTypeName);

// The token_bucket guarantee, for all three bucket algorithms: over ANY
// interval of length T at most burst + rate*T cost is admitted. Offered load
// 3x the rate, random costs, same-instant bursts and idle gaps; approximated
// rates are checked against the configured rate (they must be slower).
TYPED_TEST(BucketTest, AdmitsAtMostBurstPlusRateTimesTOverAnyInterval) {
  using A = Algo<TypeParam>;
  for (const NamedConfig<TypeParam>& c : ConfigsOf<TypeParam>()) {
    const TypeParam& config = c.config;
    for (uint64_t seed : kBucketSeeds) {
      SCOPED_TRACE(testing::Message() << c.name << ", seed " << seed);
      TraceOptions options;
      options.rate = config.rate();
      options.capacity = config.burst();
      options.steps = 3000;
      options.load = 3;
      std::vector<Request> admitted;
      typename A::State state{};
      for (const Request& r : RandomTrace(seed, options)) {
        if (A::Step(config, state, r.at, r.cost).allowed && r.cost > 0) admitted.push_back(r);
      }
      ASSERT_GT(admitted.size(), 100u);
      ExpectAtMostBurstPlusRateTimesT(config.rate(), config.burst(), admitted);
      if (this->HasFatalFailure()) return;
    }
  }
}

// A greedy client (one unit at a time, retrying exactly after retry_after)
// gets exactly burst + floor(rate * T) through in [t0, t0 + T]: the bound
// is reached and the integer arithmetic does not drift, at fractional
// intervals (3/250ms = one per 83333.33us) and at 1/day.
//
// Except with burst 1 and an interval that is not a whole number of
// microseconds: the bucket is full (one token) at the fractional instant and
// the client can only come back at the next whole microsecond, so the refill
// in between overflows the cap and is lost each time. That client gets one
// request per ceil(1/rate) (3/250ms: one per 83334us, 0.0008% below the
// rate): 1 + floor(T / ceil(1/rate)).
//
// Run on the exact rates, with bursts a client can drain one by one (up to a
// million) and at most `burst` arriving per microsecond (the time step;
// beyond that the cap, not the rate, decides what one microsecond yields).
TYPED_TEST(BucketTest, GreedyClientGetsExactlyBurstPlusRateTimesT) {
  using A = Algo<TypeParam>;
  int checked = 0;
  for (const NamedConfig<TypeParam>& c : ConfigsOf<TypeParam>(/*exact_only=*/true)) {
    const TypeParam& config = c.config;
    const Rate rate = config.rate();
    if (config.burst() > 1'000'000 || rate.limit > config.burst() * rate.period.micros()) continue;
    SCOPED_TRACE(c.name);
    ++checked;
    // About 3000 refills, ending off the refill grid.
    const int64_t horizon_us =
        static_cast<int64_t>(static_cast<i128>(3000) * rate.period.micros() / rate.limit + 7);
    const Time t0 = kTraceOrigin + Duration::Micros(777);
    const Time end = t0 + Duration::Micros(horizon_us);
    typename A::State state{};
    int64_t admitted = 0;
    for (Time now = t0; now <= end;) {
      const Decision d = A::Step(config, state, now, 1);
      if (d.allowed) {
        ++admitted;
      } else {
        now += d.retry_after;
      }
    }
    const int64_t ceil_interval = (rate.period.micros() + rate.limit - 1) / rate.limit;
    const int64_t expected =
        config.burst() == 1
            ? 1 + horizon_us / ceil_interval
            : config.burst() + static_cast<int64_t>(static_cast<i128>(horizon_us) * rate.limit /
                                                    rate.period.micros());
    EXPECT_EQ(admitted, expected) << "over " << horizon_us << "us";
  }
  EXPECT_GE(checked, 10);
}

template <typename Config>
Config MakeSame(const TokenBucketConfig& token_bucket) {
  absl::StatusOr<Config> config =
      Config::Create({.rate = token_bucket.rate(), .burst = token_bucket.burst()});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// gcra is the token bucket in one word: on monotone traces every field of
// every Decision is the same as token_bucket's with equal rate and burst, at
// every rate and burst of the suite (approximated rates included).
TEST(BucketEquivalenceTest, GcraDecidesExactlyLikeTokenBucket) {
  for (const NamedConfig<TokenBucketConfig>& c : ConfigsOf<TokenBucketConfig>()) {
    SCOPED_TRACE(c.name);
    const TokenBucketConfig& token_bucket = c.config;
    const GcraConfig gcra = MakeSame<GcraConfig>(token_bucket);
    for (uint64_t seed : kBucketSeeds) {
      TraceOptions options;
      options.rate = token_bucket.rate();
      options.capacity = token_bucket.burst();
      options.steps = 2000;
      TokenBucketState tb_state;
      GcraState gcra_state;
      const std::vector<Request> trace = RandomTrace(seed, options);
      for (size_t i = 0; i < trace.size(); ++i) {
        const Decision want =
            Algo<TokenBucketConfig>::Step(token_bucket, tb_state, trace[i].at, trace[i].cost);
        const Decision got = Algo<GcraConfig>::Step(gcra, gcra_state, trace[i].at, trace[i].cost);
        ASSERT_TRUE(SameDecision(got, want)) << "seed " << seed << " step " << i;
      }
    }
  }
}

// leaky_bucket police is the token bucket seen from its empty side: every
// field of every Decision is the same, on monotone traces and on traces
// whose clock steps back.
TEST(BucketEquivalenceTest, LeakyPoliceDecidesExactlyLikeTokenBucket) {
  for (const NamedConfig<TokenBucketConfig>& c : ConfigsOf<TokenBucketConfig>()) {
    SCOPED_TRACE(c.name);
    const TokenBucketConfig& token_bucket = c.config;
    const LeakyPoliceConfig police = MakeSame<LeakyPoliceConfig>(token_bucket);
    for (uint64_t seed : kBucketSeeds) {
      for (bool steps_back : {false, true}) {
        TraceOptions options;
        options.rate = token_bucket.rate();
        options.capacity = token_bucket.burst();
        options.steps = 2000;
        options.steps_back = steps_back;
        TokenBucketState tb_state;
        LeakyPoliceState police_state;
        const std::vector<Request> trace = RandomTrace(seed, options);
        for (size_t i = 0; i < trace.size(); ++i) {
          const Decision want =
              Algo<TokenBucketConfig>::Step(token_bucket, tb_state, trace[i].at, trace[i].cost);
          const Decision got =
              Algo<LeakyPoliceConfig>::Step(police, police_state, trace[i].at, trace[i].cost);
          ASSERT_TRUE(SameDecision(got, want))
              << "seed " << seed << " step " << i << (steps_back ? " (clock steps back)" : "");
        }
      }
    }
  }
}

// ---- edge cases, spelled out ----

template <typename Config>
Config MakeBucket(std::string_view rate, int64_t burst = 0) {
  absl::StatusOr<Config> config = Config::Create({.rate = MustParseRate(rate), .burst = burst});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

template <typename Config>
class BucketEdgeTest : public testing::Test {};
TYPED_TEST_SUITE(BucketEdgeTest, BucketConfigTypes, AlgorithmTypeName);

// 1/day: one request, then the next exactly one day later.
TYPED_TEST(BucketEdgeTest, OnePerDayAdmitsOneRequestPerDay) {
  using A = Algo<TypeParam>;
  const TypeParam config = MakeBucket<TypeParam>("1/day");
  typename A::State state{};
  const Time t0 = kTraceOrigin + Duration::Hours(5);
  EXPECT_TRUE(A::Step(config, state, t0, 1).allowed);
  const Decision denied = A::Step(config, state, t0 + Duration::Seconds(1), 1);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.retry_after, Duration::Days(1) - Duration::Seconds(1));
  EXPECT_EQ(denied.reset_after, Duration::Days(1) - Duration::Seconds(1));
  EXPECT_FALSE(A::Step(config, state, t0 + Duration::Days(1) - Duration::Micros(1), 1).allowed);
  EXPECT_TRUE(A::Step(config, state, t0 + Duration::Days(1), 1).allowed);
  EXPECT_TRUE(A::Step(config, state, t0 + Duration::Days(1), 2).can_never_pass());
}

// 3/250ms refills one token every 83333.33us: retry_after rounds each
// refill up to the next whole microsecond without accumulating the rounding.
TYPED_TEST(BucketEdgeTest, FractionalIntervalRoundsUpWithoutDrift) {
  using A = Algo<TypeParam>;
  const TypeParam config = MakeBucket<TypeParam>("3/250ms");
  typename A::State state{};
  const Time t0 = kTraceOrigin;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(A::Step(config, state, t0, 1).allowed);
  // Token k arrives at t0 + k * 250000/3 us; the greedy client gets it at the
  // ceiling of that.
  for (const int64_t k : {1, 2, 3, 4, 5, 6}) {
    const Decision d = A::Step(config, state, t0 + Duration::Micros((k - 1) * 250000 / 3 + 1), 1);
    ASSERT_FALSE(d.allowed) << "k=" << k;
    const int64_t arrival = (k * 250000 + 2) / 3;  // ceil(k * 250000 / 3)
    EXPECT_EQ(d.retry_after.micros(), arrival - ((k - 1) * 250000 / 3 + 1)) << "k=" << k;
    ASSERT_TRUE(A::Step(config, state, t0 + Duration::Micros(arrival), 1).allowed) << "k=" << k;
  }
  // Three tokens per 250ms exactly, even a whole hour later.
  const Time hour = t0 + Duration::Hours(1);
  int admitted = 0;
  for (Time t = hour; t <= hour + Duration::Millis(250); t += Duration::Micros(1000)) {
    admitted += A::Step(config, state, t, 1).allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 3 + 3);  // burst + rate * 250ms: a full bucket, then three refills
}

// burst 0 means burst = rate.limit; a cost above it can never pass, at
// once or after any idle time.
TYPED_TEST(BucketEdgeTest, CostAboveBurstNeverPassesEvenWhenFull) {
  using A = Algo<TypeParam>;
  const TypeParam config = MakeBucket<TypeParam>("40/min");
  EXPECT_EQ(config.burst(), 40);
  typename A::State state{};
  const Decision d = A::Step(config, state, kTraceOrigin, 41);
  EXPECT_TRUE(d.can_never_pass());
  EXPECT_EQ(d.remaining, 40);
  EXPECT_TRUE(A::Step(config, state, kYear2070, 41).can_never_pass());
  EXPECT_TRUE(A::Step(config, state, kYear2070, 40).allowed);
}

// The largest bursts Create accepts, at the fastest exact rate (2048 ticks
// per microsecond), in 2070 and with the clock stepping back to 1970: no
// overflow (UBSan), and the decisions stay sane.
TYPED_TEST(BucketEdgeTest, LargestValidBurstDoesNotOverflowIn2070) {
  using A = Algo<TypeParam>;
  const Rate rate = MustParseRate("2048/us");
  // The largest burst Create accepts, by bisection.
  int64_t lo = 1, hi = int64_t{1} << 62;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (TypeParam::Create({.rate = rate, .burst = mid}).ok() ? lo : hi) = mid;
  }
  const TypeParam config = *TypeParam::Create({.rate = rate, .burst = lo});
  const int64_t burst = config.burst();
  // Refilling the whole burst takes burst / (2048 per us) = 2^50us, about
  // 36 years: drain it then, so that it is full again in 2070.
  const Duration refill = Duration::Micros((burst + 2047) / 2048);
  const Time drained_at = kYear2070 - refill;
  typename A::State state{};
  const Decision first = A::Step(config, state, drained_at, burst);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 0);
  EXPECT_EQ(first.reset_after, refill);
  const Decision second = A::Step(config, state, drained_at, burst);
  EXPECT_FALSE(second.allowed);
  EXPECT_EQ(second.retry_after, refill);
  const Decision back = A::Step(config, state, kNearEpoch, 1);
  EXPECT_FALSE(back.allowed);
  EXPECT_EQ(kNearEpoch + back.retry_after, drained_at + Duration::Micros(1));
  EXPECT_EQ(kNearEpoch + back.reset_after, kYear2070);
  EXPECT_FALSE(A::Step(config, state, kYear2070 - Duration::Micros(1), burst).allowed);
  const Decision full = A::Step(config, state, kYear2070, burst);
  EXPECT_TRUE(full.allowed);
  EXPECT_EQ(full.reset_after, refill);
}

}  // namespace
}  // namespace sluice::conformance
