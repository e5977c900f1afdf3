#include "conformance/algorithms.h"

#include <string>
#include <vector>

#include "sluice/algorithm/bucket_rate.h"

namespace sluice::conformance {

namespace {

LimitOptions Options(Algorithm algorithm, const Rate& rate, int64_t burst = 0) {
  LimitOptions options;
  options.algorithm = algorithm;
  options.rate = rate;
  options.burst = burst;
  return options;
}

std::vector<AlgorithmCase> MakeCases() {
  std::vector<AlgorithmCase> cases;
  auto add = [&](std::string name, const LimitOptions& options, bool exact) {
    cases.push_back({std::move(name), MustMakeLimit(options), exact});
  };
  for (const NamedRate& named : kRates) {
    const Rate rate = MustParseRate(named.text);
    const absl::StatusOr<BucketRate> bucket_rate = MakeBucketRate(rate);
    const bool exact = bucket_rate.ok() && bucket_rate->exact;
    const std::string suffix(named.name);
    for (const auto& [algorithm, prefix] :
         {std::pair{Algorithm::kTokenBucket, "token_bucket_"}, std::pair{Algorithm::kGcra, "gcra_"},
          std::pair{Algorithm::kLeakyBucket, "leaky_police_"}}) {
      add(prefix + suffix, Options(algorithm, rate), exact);
      add(prefix + suffix + "_burst1", Options(algorithm, rate, 1), exact);
      if (named.text == "7/s") {
        add(prefix + suffix + "_burst10", Options(algorithm, rate, 10), exact);
      }
      if (named.text == "2000/us") {
        // The largest burst the tick arithmetic accepts (burst * ticks_per_token <= 2^61).
        add(prefix + suffix + "_burstMax",
            Options(algorithm, rate, (int64_t{1} << 61) / bucket_rate->ticks_per_token), exact);
      }
    }
    const auto shape = [&](Duration max_delay, int64_t queue) {
      LimitOptions options = Options(Algorithm::kLeakyBucket, rate);
      options.mode = LeakyMode::kShape;
      options.max_delay = max_delay;
      options.queue = queue;
      return options;
    };
    add("leaky_shape_" + suffix, shape(Duration::Zero(), 0), exact);
    add("leaky_shape_" + suffix + "_maxDelay2s", shape(Duration::Seconds(2), 0), exact);
    add("leaky_shape_" + suffix + "_queue4", shape(Duration::Zero(), 4), exact);
    if (named.text == "40/min") {
      add("leaky_shape_" + suffix + "_maxDelay30s_queue5", shape(Duration::Seconds(30), 5), exact);
    }
    add("fixed_window_" + suffix, Options(Algorithm::kFixedWindow, rate), true);
    add("sliding_log_" + suffix, Options(Algorithm::kSlidingLog, rate), true);
    add("sliding_window_" + suffix, Options(Algorithm::kSlidingWindow, rate), true);
  }
  return cases;
}

}  // namespace

const std::vector<AlgorithmCase>& AllAlgorithmCases() {
  static const std::vector<AlgorithmCase>* const all = new std::vector<AlgorithmCase>(MakeCases());
  return *all;
}

}  // namespace sluice::conformance
