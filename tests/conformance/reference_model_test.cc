// Every algorithm against its reference model (reference_models.h), decision
// by decision and field by field, on seeded random traces at every exact
// rate of the suite (3/250ms, 7/s, 40/min, 5/h, 1/day, 100/s, 2000/us), with
// costs 0..3, costs at and above capacity, same-instant bursts, boundary
// straddles, idle gaps, and (second group) a clock that steps back.
#include <cstdint>
#include <type_traits>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/reference_models.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

constexpr uint64_t kReferenceModelSeeds[] = {101, 102, 103};
constexpr int kReferenceModelSteps = 2000;

TokenBucketModel ModelFor(const TokenBucketConfig& c) { return {c.rate(), c.burst()}; }
GcraModel ModelFor(const GcraConfig& c) { return {c.rate(), c.burst()}; }
// police is the token bucket seen from its empty side: the same model.
TokenBucketModel ModelFor(const LeakyPoliceConfig& c) { return {c.rate(), c.burst()}; }
LeakyShapeModel ModelFor(const LeakyShapeConfig& c) {
  // The config reports max_delay after defaulting; pass the options as set.
  return {c.rate(), c.max_delay(), c.queue()};
}
FixedWindowModel ModelFor(const FixedWindowConfig& c) { return FixedWindowModel(c.rate()); }
SlidingWindowModel ModelFor(const SlidingWindowConfig& c) { return SlidingWindowModel(c.rate()); }
SlidingLogModel ModelFor(const SlidingLogConfig& c) { return SlidingLogModel(c.rate()); }

template <typename Config>
void ExpectMatchesModel(const Config& config, uint64_t seed, bool steps_back) {
  using A = Algo<Config>;
  TraceOptions options;
  options.rate = config.rate();
  options.capacity = A::Capacity(config);
  options.steps = kReferenceModelSteps;
  options.steps_back = steps_back;
  const std::vector<Request> trace = RandomTrace(seed, options);
  auto model = ModelFor(config);
  typename A::State state{};
  int allowed = 0, denied = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Decision got = A::Step(config, state, trace[i].at, trace[i].cost);
    const Decision want = model.Decide(trace[i].at, trace[i].cost);
    ASSERT_TRUE(SameDecision(got, want))
        << "seed " << seed << " step " << i << ": cost " << trace[i].cost << " at "
        << TimeString(trace[i].at)
        << (i > 0 ? " (previous at " + TimeString(trace[i - 1].at) + ")" : "");
    (got.allowed ? allowed : denied) += 1;
  }
  // The trace must exercise both answers to mean anything.
  EXPECT_GT(allowed, kReferenceModelSteps / 10);
  EXPECT_GT(denied, kReferenceModelSteps / 20);
}

template <typename Config>
class ReferenceModelTest : public testing::Test {
 protected:
  void ExpectAllMatch(bool steps_back) {
    for (const NamedConfig<Config>& c : ConfigsOf<Config>(/*exact_only=*/true)) {
      for (uint64_t seed : kReferenceModelSeeds) {
        SCOPED_TRACE(c.name);
        ExpectMatchesModel(c.config, seed, steps_back);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
};

TYPED_TEST_SUITE(ReferenceModelTest, AllConfigTypes, AlgorithmTypeName);

TYPED_TEST(ReferenceModelTest, MatchesModelOnMonotoneTraces) { this->ExpectAllMatch(false); }

TYPED_TEST(ReferenceModelTest, MatchesModelWhenTheClockStepsBack) { this->ExpectAllMatch(true); }

}  // namespace
}  // namespace sluice::conformance
