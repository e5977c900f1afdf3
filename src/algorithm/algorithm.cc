#include "sluice/algorithm.h"

#include <array>
#include <utility>

#include "base/cat.h"

namespace sluice {

using internal::Cat;

namespace {

constexpr std::array<std::pair<Algorithm, std::string_view>, 7> kNames = {{
    {Algorithm::kTokenBucket, "token_bucket"},
    {Algorithm::kGcra, "gcra"},
    {Algorithm::kLeakyBucket, "leaky_bucket"},
    {Algorithm::kFixedWindow, "fixed_window"},
    {Algorithm::kSlidingLog, "sliding_log"},
    {Algorithm::kSlidingWindow, "sliding_window"},
    {Algorithm::kConcurrency, "concurrency"},
}};

template <typename Config, typename Options>
absl::StatusOr<LimitConfig> Wrap(const Options& options) {
  absl::StatusOr<Config> config = Config::Create(options);
  if (!config.ok()) return config.status();
  return LimitConfig(std::in_place_type<Config>, *std::move(config));
}

}  // namespace

std::string_view AlgorithmName(Algorithm algorithm) {
  for (const auto& [a, name] : kNames) {
    if (a == algorithm) return name;
  }
  return "unknown";
}

std::optional<Algorithm> AlgorithmFromName(std::string_view name) {
  for (const auto& [a, n] : kNames) {
    if (n == name) return a;
  }
  return std::nullopt;
}

absl::StatusOr<LimitConfig> MakeLimit(const LimitOptions& options) {
  const bool bucket =
      options.algorithm == Algorithm::kTokenBucket || options.algorithm == Algorithm::kGcra ||
      (options.algorithm == Algorithm::kLeakyBucket && options.mode == LeakyMode::kPolice);
  const bool shape =
      options.algorithm == Algorithm::kLeakyBucket && options.mode == LeakyMode::kShape;
  const std::string_view name = AlgorithmName(options.algorithm);
  if (!bucket && options.burst != 0) {
    return absl::InvalidArgumentError(
        internal::Cat(name, shape ? " mode shape" : "",
                      ": burst applies only to token_bucket, gcra and "
                      "leaky_bucket mode police (a window's limit is its rate)"));
  }
  if (options.algorithm != Algorithm::kConcurrency && options.lease_ttl != Duration::Zero()) {
    return absl::InvalidArgumentError(
        internal::Cat(name, ": lease_ttl applies only to concurrency"));
  }
  if (!shape && (options.max_delay != Duration::Zero() || options.queue != 0)) {
    return absl::InvalidArgumentError(
        internal::Cat(name, ": max_delay and queue apply only to leaky_bucket mode shape"));
  }
  absl::StatusOr<LimitConfig> result;
  switch (options.algorithm) {
    case Algorithm::kTokenBucket:
      result = Wrap<TokenBucketConfig>(BucketOptions{options.rate, options.burst});
      break;
    case Algorithm::kGcra:
      result = Wrap<GcraConfig>(BucketOptions{options.rate, options.burst});
      break;
    case Algorithm::kLeakyBucket:
      result =
          shape
              ? Wrap<LeakyShapeConfig>(ShapeOptions{options.rate, options.max_delay, options.queue})
              : Wrap<LeakyPoliceConfig>(BucketOptions{options.rate, options.burst});
      break;
    case Algorithm::kFixedWindow:
      result = Wrap<FixedWindowConfig>(WindowOptions{options.rate});
      break;
    case Algorithm::kSlidingLog:
      result = Wrap<SlidingLogConfig>(WindowOptions{options.rate});
      break;
    case Algorithm::kSlidingWindow:
      result = Wrap<SlidingWindowConfig>(WindowOptions{options.rate});
      break;
    case Algorithm::kConcurrency:
      if (options.rate.period != Duration::Zero()) {
        result = absl::InvalidArgumentError(
            "a concurrency limit has no period (rate.limit is its slots; a slot is held until "
            "released or for lease_ttl)");
        break;
      }
      result = Wrap<ConcurrencyConfig>(ConcurrencyOptions{
          .limit = options.rate.limit,
          .lease_ttl =
              options.lease_ttl == Duration::Zero() ? kDefaultLeaseTtl : options.lease_ttl});
      break;
  }
  if (!result.ok()) {
    return absl::InvalidArgumentError(internal::Cat(name, ": ", result.status().message()));
  }
  return result;
}

const Rate& RateOf(const LimitConfig& config) {
  return std::visit([](const auto& c) -> const Rate& { return c.rate(); }, config);
}

Algorithm AlgorithmOf(const LimitConfig& config) {
  switch (config.index()) {
    case 0:
      return Algorithm::kTokenBucket;
    case 1:
      return Algorithm::kGcra;
    case 2:
    case 3:
      return Algorithm::kLeakyBucket;
    case 4:
      return Algorithm::kFixedWindow;
    case 5:
      return Algorithm::kSlidingLog;
    case 6:
      return Algorithm::kSlidingWindow;
    default:
      return Algorithm::kConcurrency;
  }
}

bool IsShape(const LimitConfig& config) { return std::holds_alternative<LeakyShapeConfig>(config); }

bool Charges(const LimitConfig& config) {
  return std::visit([](const auto& c) { return kCharges<std::decay_t<decltype(c)>>; }, config);
}

bool IsConcurrency(const LimitConfig& config) {
  return std::holds_alternative<ConcurrencyConfig>(config);
}

std::string DescribeLimit(const LimitOptions& limit) {
  std::string out(AlgorithmName(limit.algorithm));
  if (limit.algorithm == Algorithm::kConcurrency) {
    out += Cat(" ", limit.rate.limit);
    if (limit.lease_ttl != Duration::Zero() && limit.lease_ttl != kDefaultLeaseTtl)
      out += Cat(" lease_ttl ", FormatDuration(limit.lease_ttl));
    return out;
  }
  if (limit.algorithm == Algorithm::kLeakyBucket) {
    out += limit.mode == LeakyMode::kShape ? " shape" : " police";
  }
  out += Cat(" ", FormatRate(limit.rate));
  const bool bucket =
      limit.algorithm == Algorithm::kTokenBucket || limit.algorithm == Algorithm::kGcra ||
      (limit.algorithm == Algorithm::kLeakyBucket && limit.mode == LeakyMode::kPolice);
  if (bucket && limit.burst > 0 && limit.burst != limit.rate.limit)
    out += Cat(" burst ", limit.burst);
  if (limit.mode == LeakyMode::kShape && limit.algorithm == Algorithm::kLeakyBucket) {
    if (limit.max_delay > Duration::Zero())
      out += Cat(" max_delay ", FormatDuration(limit.max_delay));
    if (limit.queue > 0) out += Cat(" queue ", limit.queue);
  }
  return out;
}

}  // namespace sluice
