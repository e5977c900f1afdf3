#include "sluice/limiter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "sluice/store/memory_store.h"
#include "store/memory/remote_test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

constexpr Time kStart = Time::FromUnixMicros(1'700'000'000'000'000);

LimitOptions L(Algorithm algorithm, std::string_view rate, int64_t burst = 0) {
  return {.algorithm = algorithm, .rate = *ParseRate(rate), .burst = burst};
}

class LimiterTest : public ::testing::Test {
 protected:
  std::unique_ptr<Limiter> Make(std::vector<LimitOptions> limits) {
    absl::StatusOr<std::unique_ptr<Limiter>> limiter =
        Limiter::Create(store_, {.name = "p", .limits = std::move(limits), .clock = &clock_});
    EXPECT_TRUE(limiter.ok()) << limiter.status();
    return limiter.ok() ? *std::move(limiter) : nullptr;
  }
  MemoryStore store_;
  ManualClock clock_{kStart};
};

TEST_F(LimiterTest, AKeyedLimiterInAFewLines) {
  auto limiter = Make({L(Algorithm::kGcra, "100/s", 20)});
  int admitted = 0;
  for (int i = 0; i < 30; ++i) admitted += (*limiter->Acquire("user-42")).allowed;
  EXPECT_EQ(admitted, 20);
  EXPECT_TRUE(limiter->Acquire("user-43")->allowed);
  clock_.Advance(Duration::Millis(10));
  EXPECT_TRUE(limiter->Acquire("user-42")->allowed);
}

TEST_F(LimiterTest, ALaterDenialGivesBackWhatEarlierLimitsTook) {
  // 5 per hour, and 3 per calendar minute. After 3 requests the window
  // denies; the bucket must not be charged for those denials.
  clock_.Set(Time::FromUnixMicros(60'000'000LL * 28'333'334));  // a minute boundary
  auto limiter = Make({L(Algorithm::kTokenBucket, "5/h"), L(Algorithm::kFixedWindow, "3/min")});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter->Acquire("k")->allowed);
  for (int i = 0; i < 10; ++i) {
    const absl::StatusOr<PolicyDecision> d = limiter->Acquire("k");
    EXPECT_FALSE(d->allowed);
    EXPECT_EQ(d->limit_index, 1u);
  }
  // Next minute: the window allows 3 again, and the bucket still holds
  // exactly the 2 tokens the 3 admitted requests left.
  clock_.Advance(Duration::Minutes(1));
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
  const absl::StatusOr<PolicyDecision> third = limiter->Acquire("k");
  EXPECT_FALSE(third->allowed);
  EXPECT_EQ(third->limit_index, 0u);
}

TEST_F(LimiterTest, DenialReportsTheLongestWaitAcrossLimits) {
  // Both limits are exhausted; the first would allow again after 1 s, the
  // second only after a minute. Retry-After must cover the minute.
  auto limiter = Make({L(Algorithm::kGcra, "1/s", 1), L(Algorithm::kFixedWindow, "1/min")});
  clock_.Set(Time::FromUnixMicros(60'000'000LL * 28'333'334));  // a minute boundary
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
  const absl::StatusOr<PolicyDecision> d = limiter->Acquire("k");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->allowed);
  EXPECT_EQ(d->retry_after, Duration::Minutes(1));
  EXPECT_EQ(d->limit_index, 1u);
}

TEST_F(LimiterTest, AllowedReportsTheLeastRemaining) {
  auto limiter = Make({L(Algorithm::kTokenBucket, "100/s"), L(Algorithm::kFixedWindow, "10/min")});
  const absl::StatusOr<PolicyDecision> d = limiter->Acquire("k");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->remaining, 9);
  EXPECT_EQ(d->limit, 10);
  EXPECT_EQ(d->limit_index, 1u);
}

TEST_F(LimiterTest, ShapeIsDecidedLastAndItsDelayIsReported) {
  LimitOptions shape{.algorithm = Algorithm::kLeakyBucket,
                     .rate = *ParseRate("2/s"),
                     .mode = LeakyMode::kShape,
                     .max_delay = Duration::Seconds(5)};
  auto limiter = Make({shape, L(Algorithm::kFixedWindow, "3/min")});
  EXPECT_EQ(limiter->Acquire("k")->delay, Duration::Zero());
  EXPECT_EQ(limiter->Acquire("k")->delay, Duration::Millis(500));
  EXPECT_EQ(limiter->Acquire("k")->delay, Duration::Seconds(1));
  // The window denies the fourth; had shape gone first it would have handed
  // out (and lost) the 1.5 s slot. The next allowed request would get it.
  EXPECT_FALSE(limiter->Acquire("k")->allowed);
}

TEST_F(LimiterTest, LongKeysAreHashedAndStillLimited) {
  // Regression: a key over 1024 bytes was an error, which on a Redis policy
  // became a store failure that on_store_error: allow let through.
  auto limiter = Make({L(Algorithm::kFixedWindow, "2/h")});
  const std::string jwt_a(1100, 'a'), jwt_b = std::string(1099, 'a') + "b";
  EXPECT_TRUE(limiter->Acquire(jwt_a)->allowed);
  EXPECT_TRUE(limiter->Acquire(jwt_a)->allowed);
  EXPECT_FALSE(limiter->Acquire(jwt_a)->allowed);
  EXPECT_TRUE(limiter->Acquire(jwt_b)->allowed);  // another long key, its own state
  // The state lives under the SHA-256, which every instance computes alike
  // (python3 -c "import hashlib; print(hashlib.sha256(b'a' * 1100).hexdigest())").
  absl::StatusOr<std::vector<Decision>> state = limiter->Inspect(
      "sha256:a82bbb9b6dd92b2fd52720c83efdc57b89d12ddff7e5d4b54074b0f5f9d31e05", clock_.Now(), 0);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->at(0).remaining, 0);
  EXPECT_EQ(limiter->Inspect(jwt_a, clock_.Now(), 0)->at(0).remaining, 0);
  // A refund finds the same state.
  ASSERT_TRUE(limiter->Refund(jwt_a, clock_.Now(), 1).ok());
  EXPECT_TRUE(limiter->Acquire(jwt_a)->allowed);
}

TEST_F(LimiterTest, LongKeysCanBeRefused) {
  absl::StatusOr<std::unique_ptr<Limiter>> limiter =
      Limiter::Create(store_, {.name = "p",
                               .limits = {L(Algorithm::kGcra, "1/s")},
                               .long_keys = LongKeys::kRefuse,
                               .clock = &clock_});
  ASSERT_TRUE(limiter.ok());
  absl::StatusOr<PolicyDecision> d = (*limiter)->Acquire(std::string(kMaxKeyLength + 1, 'x'));
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(d.status()));
  EXPECT_THAT(d.status().message(), HasSubstr("key of 1025 bytes is longer than the maximum"));
  EXPECT_TRUE((*limiter)->Acquire(std::string(kMaxKeyLength, 'x')).ok());
}

TEST_F(LimiterTest, RejectsBadInputWithReasons) {
  auto limiter = Make({L(Algorithm::kGcra, "1/s")});
  absl::StatusOr<PolicyDecision> d = limiter->Acquire("k", {.cost = -1});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("cost must not be negative"));

  absl::StatusOr<std::unique_ptr<Limiter>> none = Limiter::Create(store_, {.name = "empty"});
  EXPECT_THAT(none.status().message(), HasSubstr("policy \"empty\": no limits"));
  absl::StatusOr<std::unique_ptr<Limiter>> bad = Limiter::Create(
      store_,
      {.name = "login",
       .limits = {L(Algorithm::kGcra, "1/s"),
                  {.algorithm = Algorithm::kFixedWindow, .rate = *ParseRate("1/s"), .burst = 5}}});
  EXPECT_THAT(bad.status().message(),
              HasSubstr("policy \"login\" limit 2: fixed_window: burst applies only"));
  LimitOptions shape{
      .algorithm = Algorithm::kLeakyBucket, .rate = *ParseRate("2/s"), .mode = LeakyMode::kShape};
  EXPECT_THAT(Limiter::Create(store_, {.name = "two", .limits = {shape, shape}}).status().message(),
              HasSubstr("at most one leaky_bucket shape limit"));
}

TEST_F(LimiterTest, CostWeighsRequests) {
  auto limiter = Make({L(Algorithm::kSlidingLog, "10/min")});
  EXPECT_TRUE(limiter->Acquire("k", {.cost = 7})->allowed);
  EXPECT_FALSE(limiter->Acquire("k", {.cost = 4})->allowed);
  EXPECT_TRUE(limiter->Acquire("k", {.cost = 3})->allowed);
  const absl::StatusOr<PolicyDecision> never = limiter->Acquire("k", {.cost = 11});
  EXPECT_TRUE(never->can_never_pass());
}

// ---- concurrency limits (docs/concurrency.md) ----

LimitOptions Concurrency(int64_t slots, Duration lease_ttl = Duration::Zero()) {
  return {.algorithm = Algorithm::kConcurrency, .rate = {.limit = slots}, .lease_ttl = lease_ttl};
}

TEST_F(LimiterTest, ConcurrencyHoldsSlotsUntilReleasedWhileOtherLimitsKeepTheirTake) {
  auto limiter = Make({Concurrency(2), L(Algorithm::kFixedWindow, "10/h")});
  ASSERT_TRUE(limiter->holds());
  const absl::StatusOr<PolicyDecision> first = limiter->Acquire("k");
  const absl::StatusOr<PolicyDecision> second = limiter->Acquire("k");
  ASSERT_TRUE(first->allowed && second->allowed);
  const absl::StatusOr<PolicyDecision> third = limiter->Acquire("k");
  EXPECT_FALSE(third->allowed);
  EXPECT_EQ(third->limit_index, 0u);
  // The longest a slot can still be held: its lease.
  EXPECT_EQ(third->retry_after, kDefaultLeaseTtl);
  EXPECT_TRUE(limiter->Acquire("other")->allowed);  // keys are apart

  ASSERT_TRUE(limiter->Release("k", *first, 1).ok());
  const absl::StatusOr<PolicyDecision> fourth = limiter->Acquire("k");
  EXPECT_TRUE(fourth->allowed);
  // The window kept what every admitted request took: 3 of 10 for "k".
  const absl::StatusOr<std::vector<Decision>> state = limiter->Inspect("k", clock_.Now(), 0);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ((*state)[0].remaining, 0);
  EXPECT_EQ((*state)[1].remaining, 7);
}

TEST_F(LimiterTest, AnUnreleasedSlotComesBackWhenItsLeaseEnds) {
  auto limiter = Make({Concurrency(1, Duration::Seconds(5))});
  ASSERT_TRUE(limiter->Acquire("k")->allowed);  // never released: its holder died
  clock_.Advance(Duration::Millis(4999));
  const absl::StatusOr<PolicyDecision> denied = limiter->Acquire("k");
  EXPECT_FALSE(denied->allowed);
  EXPECT_EQ(denied->retry_after, Duration::Millis(1));
  clock_.Advance(Duration::Millis(1));
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
}

TEST_F(LimiterTest, ADenialByALaterLimitFreesTheSlot) {
  auto limiter = Make({Concurrency(1), L(Algorithm::kFixedWindow, "1/h")});
  const absl::StatusOr<PolicyDecision> first = limiter->Acquire("k");
  ASSERT_TRUE(first->allowed);
  ASSERT_TRUE(limiter->Release("k", *first, 1).ok());
  // The slot is free and the window is spent: denied, and the slot the
  // concurrency limit took for it is given back at once.
  const absl::StatusOr<PolicyDecision> second = limiter->Acquire("k");
  EXPECT_FALSE(second->allowed);
  EXPECT_EQ(second->limit_index, 1u);
  const absl::StatusOr<std::vector<Decision>> state = limiter->Inspect("k", clock_.Now(), 0);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ((*state)[0].remaining, 1);
}

TEST_F(LimiterTest, ASlotGivenBackTwiceGivesBackNothingTheSecondTime) {
  auto limiter = Make({Concurrency(2)});
  // Two at one instant: each holds slots of its own name.
  const absl::StatusOr<PolicyDecision> first = limiter->Acquire("k");
  const absl::StatusOr<PolicyDecision> second = limiter->Acquire("k");
  ASSERT_TRUE(first->allowed && second->allowed);
  EXPECT_NE(first->slot, 0u);
  EXPECT_NE(first->slot, second->slot);
  ASSERT_TRUE(limiter->Release("k", *first, 1).ok());
  ASSERT_TRUE(limiter->Release("k", *first, 1).ok());  // gives back nothing
  ASSERT_TRUE(limiter->Refund("k", *first, 1).ok());   // nor does this
  const absl::StatusOr<PolicyDecision> third = limiter->Acquire("k");
  EXPECT_TRUE(third->allowed);
  EXPECT_FALSE(limiter->Acquire("k")->allowed);  // `second` still holds its slot
  // A renew of released slots is lost; of held ones, it keeps their name.
  const auto renew = [&](const PolicyDecision& taken) {
    absl::StatusOr<PolicyDecision> out;
    limiter->RenewAsync("k", clock_.Now(), taken, 1,
                        [&](absl::StatusOr<PolicyDecision> d) { out = std::move(d); });
    return out;
  };
  clock_.Advance(Duration::Seconds(1));
  EXPECT_FALSE(renew(*first)->allowed);
  const absl::StatusOr<PolicyDecision> renewed = renew(*second);
  ASSERT_TRUE(renewed->allowed);
  EXPECT_EQ(renewed->slot, second->slot);
  EXPECT_FALSE(limiter->Acquire("k")->allowed);
  ASSERT_TRUE(limiter->Release("k", *renewed, 1).ok());
  ASSERT_TRUE(limiter->Release("k", *second, 1).ok());  // the same slots: nothing more
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
  EXPECT_FALSE(limiter->Acquire("k")->allowed);
}

// A store in another process, as Redis is to sluice, that can be made to
// fail every call (unreachable) and to work again.
class UnreachableAtWill final : public RemoteOverMemory {
 public:
  void DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op, Time now,
                   int64_t cost, Time taken_at, uint64_t slot, BatchCallback done,
                   BatchCallback /*late*/) override {
    if (unreachable) return done(absl::UnavailableError("unreachable"));
    Store::DecideBatch(tables, key, op, now, cost, taken_at, slot, std::move(done));
  }
  bool unreachable = false;
};

TEST_F(LimiterTest, ARenewalTheRemoteStoreFailedKeepsTheLocalSlotsItRenewed) {
  // Two slots in this process, ten in the fleet's store. A renewal the
  // remote store could not take fails, and the caller still holds the
  // lease: its local slot stays held (given back, a third request would
  // get past the process's limit of two).
  UnreachableAtWill fleet;
  absl::StatusOr<std::unique_ptr<Limiter>> made =
      Limiter::Create(store_, {.name = "p",
                               .limits = {Concurrency(2), Concurrency(10)},
                               .stores = {nullptr, &fleet},
                               .clock = &clock_});
  ASSERT_TRUE(made.ok()) << made.status();
  Limiter& limiter = **made;
  const auto acquire = [&] {
    absl::StatusOr<PolicyDecision> out;
    limiter.AcquireSlotsAsync("k", clock_.Now(), 1,
                              [&](absl::StatusOr<PolicyDecision> d) { out = std::move(d); });
    return out;
  };
  const absl::StatusOr<PolicyDecision> first = acquire();
  const absl::StatusOr<PolicyDecision> second = acquire();
  ASSERT_TRUE(first.ok() && first->allowed && second.ok() && second->allowed);
  clock_.Advance(Duration::Seconds(20));
  fleet.unreachable = true;
  absl::StatusOr<PolicyDecision> renewed;
  limiter.RenewAsync("k", clock_.Now(), *first, 1,
                     [&](absl::StatusOr<PolicyDecision> d) { renewed = std::move(d); });
  EXPECT_EQ(renewed.status().code(), absl::StatusCode::kUnavailable);
  fleet.unreachable = false;
  const absl::StatusOr<PolicyDecision> third = acquire();
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->allowed);
  EXPECT_EQ(third->limit_index, 0u);  // the process's two are held
  // A fresh acquire the remote store fails gives its local slot back.
  ASSERT_TRUE(limiter.Release("k", *second, 1).ok());
  fleet.unreachable = true;
  EXPECT_FALSE(acquire().ok());
  fleet.unreachable = false;
  const absl::StatusOr<PolicyDecision> fourth = acquire();
  ASSERT_TRUE(fourth.ok());
  EXPECT_TRUE(fourth->allowed);
}

// On a CoarseClock, every algorithm still never admits more than its limit
// allows over true time: the coarse time is behind, never ahead, so it can
// only see less refill and later windows. Each limit is hammered for 300 ms
// of real time.
TEST(CoarseClockLimits, NoAlgorithmAdmitsMoreThanTrueTimeAllows) {
  const SystemClock& system = SystemClock::Default();
  CoarseClock coarse(Duration::Micros(250), system);
  for (const Algorithm algorithm :
       {Algorithm::kGcra, Algorithm::kTokenBucket, Algorithm::kFixedWindow,
        Algorithm::kSlidingWindow, Algorithm::kSlidingLog, Algorithm::kLeakyBucket}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    MemoryStore store;
    // 1,000/s with a burst of 10 (the windows: 10 per 10 ms).
    const bool window = algorithm == Algorithm::kFixedWindow ||
                        algorithm == Algorithm::kSlidingWindow ||
                        algorithm == Algorithm::kSlidingLog;
    LimitOptions limit = window ? L(algorithm, "10/10ms") : L(algorithm, "1000/s", 10);
    absl::StatusOr<std::unique_ptr<Limiter>> limiter =
        Limiter::Create(store, {.name = "p", .limits = {limit}, .clock = &coarse});
    ASSERT_TRUE(limiter.ok()) << limiter.status();
    const Time start = system.Now();
    // The coarse clock's time runs from where it is now, behind true time
    // by this much (a loaded machine may delay its thread): the run may see
    // that much more of coarse time than of true time.
    const int64_t behind_ms = (start - coarse.Now()).micros() / 1000 + 1;
    int64_t admitted = 0;
    while (system.Now() - start < Duration::Millis(300)) {
      admitted += (*limiter)->Acquire("k")->allowed;
    }
    const int64_t elapsed_ms = (system.Now() - start).micros() / 1000 + 1;
    // The burst (or a window at each end), and the rate over true time.
    EXPECT_LE(admitted, 20 + elapsed_ms + behind_ms) << "over " << elapsed_ms << " ms";
    EXPECT_GT(admitted, elapsed_ms / 4);  // and it does admit (the rate, less the staleness)
  }
}

TEST(ConcurrencyLimit, OptionsAreValidated) {
  EXPECT_TRUE(MakeLimit(Concurrency(10)).ok());
  EXPECT_THAT(MakeLimit(Concurrency(0)).status().message(), HasSubstr("limit must be 1 to"));
  EXPECT_THAT(MakeLimit(Concurrency(10, Duration::Millis(10))).status().message(),
              HasSubstr("lease_ttl must be 100ms to 1d"));
  LimitOptions with_period = Concurrency(10);
  with_period.rate.period = Duration::Seconds(1);
  EXPECT_THAT(MakeLimit(with_period).status().message(), HasSubstr("has no period"));
  LimitOptions ttl_elsewhere = L(Algorithm::kGcra, "10/s");
  ttl_elsewhere.lease_ttl = Duration::Seconds(1);
  EXPECT_THAT(MakeLimit(ttl_elsewhere).status().message(),
              HasSubstr("lease_ttl applies only to concurrency"));
  EXPECT_EQ(DescribeLimit(Concurrency(10)), "concurrency 10");
  EXPECT_EQ(DescribeLimit(Concurrency(10, Duration::Seconds(90))), "concurrency 10 lease_ttl 90s");
  EXPECT_EQ(AlgorithmFromName("concurrency"), Algorithm::kConcurrency);
  EXPECT_TRUE(IsConcurrency(*MakeLimit(Concurrency(3))));
  EXPECT_FALSE(IsConcurrency(*MakeLimit(L(Algorithm::kSlidingLog, "3/s"))));
}

// ---- settled costs ----

TEST_F(LimiterTest, ASettledCostGivesBackOrChargesTheDifferenceAsDebt) {
  clock_.Set(Time::FromUnixMicros(60'000'000LL * 28'333'334));  // a minute boundary
  auto limiter = Make({L(Algorithm::kGcra, "10/s"), L(Algorithm::kFixedWindow, "100/min")});
  // Reserved 5, cost 2: 3 come back to both limits.
  const absl::StatusOr<PolicyDecision> small = limiter->Acquire("k", {.cost = 5});
  ASSERT_TRUE(small->allowed);
  ASSERT_TRUE(limiter->Settle("k", *small, 5, 2).ok());
  absl::StatusOr<std::vector<Decision>> state = limiter->Inspect("k", clock_.Now(), 0);
  EXPECT_EQ((*state)[0].remaining, 8);
  EXPECT_EQ((*state)[1].remaining, 98);
  // Reserved 5 (7 of the bucket's 10 in use), cost 40: 35 more charged,
  // 42 in use, 32 of them debt: nothing passes until 3.3 s of refill have
  // repaid it and freed one token.
  const absl::StatusOr<PolicyDecision> big = limiter->Acquire("k", {.cost = 5});
  ASSERT_TRUE(big->allowed);
  ASSERT_TRUE(limiter->Settle("k", *big, 5, 40).ok());
  const absl::StatusOr<PolicyDecision> denied = limiter->Acquire("k");
  EXPECT_FALSE(denied->allowed);
  EXPECT_EQ(denied->retry_after, Duration::Millis(3300));
  state = limiter->Inspect("k", clock_.Now(), 0);
  EXPECT_EQ((*state)[1].remaining, 58);  // 2 + 40 of 100 this minute
  clock_.Advance(Duration::Millis(3300));
  EXPECT_TRUE(limiter->Acquire("k")->allowed);
  // Nothing to settle, and bad input.
  EXPECT_TRUE(limiter->Settle("k", *big, 3, 3).ok());
  EXPECT_FALSE(limiter->Settle("k", *big, -1, 3).ok());
}

TEST_F(LimiterTest, ASettledChargeNeedsLimitsThatCarryDebt) {
  auto limiter = Make({L(Algorithm::kSlidingLog, "10/s"), Concurrency(3)});
  const absl::StatusOr<PolicyDecision> d = limiter->Acquire("k", {.cost = 2});
  ASSERT_TRUE(d->allowed);
  EXPECT_THAT(limiter->Settle("k", *d, 2, 5).message(), HasSubstr("cannot carry debt"));
  // Giving back works for every limit but the concurrency slots.
  ASSERT_TRUE(limiter->Settle("k", *d, 2, 1).ok());
  const absl::StatusOr<std::vector<Decision>> state = limiter->Inspect("k", clock_.Now(), 0);
  EXPECT_EQ((*state)[0].remaining, 9);
  EXPECT_EQ((*state)[1].remaining, 1);
}

// An hour of LLM-like traffic on a limit of 10,000 tokens a minute: each
// request reserves an estimate of 500 and settles, 0 to 2 s later, at a
// true cost of 0 to 2,500 (five times the estimate). Demand never stops.
// What the requests really cost comes to the limit's rate over the hour
// (docs/settled-costs.md): at most the rate over the hour and the time it
// takes to repay the debt left at its end, plus one burst (a window), and
// at least the hour's contract less one burst, for each algorithm that
// carries debt; charging the estimate alone lets 2.5 times the limit through.
TEST_F(LimiterTest, SettledCostsKeepTheLongRunRate) {
  const Duration kHour = Duration::Hours(1);
  constexpr int64_t kEstimate = 500, kPerMinute = 10'000;
  for (const Algorithm algorithm : {Algorithm::kGcra, Algorithm::kTokenBucket,
                                    Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    for (const bool settle : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << AlgorithmName(algorithm) << (settle ? "" : ", unsettled"));
      clock_.Set(Time::FromUnixMicros(60'000'000LL * 28'333'334));
      const Time start = clock_.Now();
      auto limiter = Make({L(algorithm, "10000/min")});
      std::mt19937_64 rng(7);
      struct InFlight {
        Time done;
        PolicyDecision taken;
        int64_t actual;
      };
      std::vector<InFlight> in_flight;
      int64_t admitted_actual = 0;
      while (clock_.Now() < start + kHour) {
        for (size_t i = 0; i < in_flight.size();) {
          if (in_flight[i].done > clock_.Now()) {
            ++i;
            continue;
          }
          if (settle) {
            ASSERT_TRUE(
                limiter->Settle("k", in_flight[i].taken, kEstimate, in_flight[i].actual).ok());
          }
          in_flight[i] = in_flight.back();
          in_flight.pop_back();
        }
        for (absl::StatusOr<PolicyDecision> d = limiter->Acquire("k", {.cost = kEstimate});
             d->allowed; d = limiter->Acquire("k", {.cost = kEstimate})) {
          const int64_t actual = std::uniform_int_distribution<int64_t>(0, 5 * kEstimate)(rng);
          const Duration latency =
              Duration::Micros(std::uniform_int_distribution<int64_t>(0, 2'000'000)(rng));
          in_flight.push_back({clock_.Now() + latency, *d, actual});
          admitted_actual += actual;
        }
        clock_.Advance(Duration::Millis(10));
      }
      const int64_t contract = kPerMinute * 60;
      if (!settle) {
        EXPECT_GT(admitted_actual, contract * 2);
        continue;
      }
      // The last requests settle; then the debt they leave is repaid: the
      // time until the key admits a request again counts against the rate.
      for (const InFlight& f : in_flight) {
        if (f.done > clock_.Now()) clock_.Set(f.done);
        ASSERT_TRUE(limiter->Settle("k", f.taken, kEstimate, f.actual).ok());
      }
      while (!limiter->Check("k", {.cost = 1})->allowed) clock_.Advance(Duration::Millis(10));
      const double minutes = static_cast<double>((clock_.Now() - start).micros()) / 60e6;
      EXPECT_LE(admitted_actual, static_cast<int64_t>(kPerMinute * minutes) + kPerMinute);
      EXPECT_GE(admitted_actual, contract - kPerMinute);
      EXPECT_LE(minutes, 62.0);  // the debt left is a few requests' worth
    }
  }
}

}  // namespace
}  // namespace sluice
