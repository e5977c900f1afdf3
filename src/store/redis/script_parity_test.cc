// Parity: every algorithm config gives the same answers in Redis as in C++.
//
// Each test runs one config through the script (state in Redis, time passed
// as ARGV now_us) and through the C++ algorithm (state in the test), op by
// op: fixed sequences aimed at the edges (a full bucket emptied at one
// instant, 1us steps, window boundaries, the clock stepping back by 1us and
// by years, idle decades) and seeded random ones (thousands of decides,
// checks and refunds, random costs including 0 and above the capacity).
// After every op both sides must agree on every Decision field AND the key
// Redis holds must be the C++ state's exact encoding: the states, not only
// the answers, are the same.
//
// The C++ side follows the store's rules, which the script implements: the
// state is written only when a decide takes something (a denial or a peek
// leaves no trace), a check writes nothing, a refund of a key that does not
// exist does nothing, and a state that is fresh after a write is dropped.
#include <cstdint>
#include <deque>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "algorithm/bucket_math.h"
#include "conformance/algorithms.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"
#include "sanitizers.h"
#include "store/redis/script_test_support.h"

namespace sluice::redis {
namespace {

using conformance::Algo;
using conformance::DebugString;
using conformance::kNearEpoch;
using conformance::kTraceOrigin;
using conformance::kYear2070;
using conformance::SameDecision;
using conformance::TraceRng;
using internal::FloorDiv;

// ---- what Redis should hold for a C++ state ----

std::string Join(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values) {
    if (!out.empty()) out += ' ';
    out += std::to_string(v);
  }
  return out;
}

// A time in ticks as the script keeps it: microseconds, then the sub-tick
// remainder when it is not 0.
std::string Ticks(int64_t ticks, int64_t per_us) {
  const int64_t us = FloorDiv(ticks, per_us);
  const int64_t rem = ticks - us * per_us;
  return rem == 0 ? std::to_string(us) : Join({us, rem});
}

std::vector<std::string> Encode(const TokenBucketConfig&, const TokenBucketState& s) {
  return {Join({s.tokens_ticks, s.last_us})};
}
std::vector<std::string> Encode(const GcraConfig& c, const GcraState& s) {
  return {Ticks(s.tat_ticks, c.bucket_rate().ticks_per_us)};
}
std::vector<std::string> Encode(const LeakyPoliceConfig&, const LeakyPoliceState& s) {
  return {Join({s.level_ticks, s.last_us})};
}
std::vector<std::string> Encode(const LeakyShapeConfig& c, const LeakyShapeState& s) {
  return {Ticks(s.next_free_ticks, c.bucket_rate().ticks_per_us)};
}
std::vector<std::string> Encode(const FixedWindowConfig&, const FixedWindowState& s) {
  return {Join({s.window, s.count})};
}
std::vector<std::string> Encode(const SlidingWindowConfig&, const SlidingWindowState& s) {
  return {Join({s.window, s.prev, s.curr})};
}
std::vector<std::string> Encode(const SlidingLogConfig&, const SlidingLogState& s) {
  std::vector<std::string> out = {std::to_string(s.last_time_us()) + ":" +
                                  std::to_string(s.total_cost())};
  for (int64_t i = 0; i < s.size(); ++i) {
    const auto& e = s.at(i);
    if (s.name_at(i) != 0) {
      out.push_back(Join({e.time_us, e.cost}) + " " + std::to_string(s.name_at(i)));
    } else {
      out.push_back(e.cost == 1 ? std::to_string(e.time_us) : Join({e.time_us, e.cost}));
    }
  }
  return out;
}

// ---- the C++ side ----

template <typename Config>
class Twin {
 public:
  using A = Algo<Config>;
  using State = typename A::State;

  explicit Twin(const Config& config) : config_(config) {}

  // `slot`: a concurrency limit's slots named (Hold); 0: counted.
  Decision Decide(Time now, int64_t cost, uint64_t slot = 0) {
    State next = state_ ? A::Copy(*state_) : State{};
    Decision d;
    if constexpr (kNamed) {
      d = slot != 0 ? Hold(config_, next, now, cost, slot) : A::Step(config_, next, now, cost);
    } else {
      d = A::Step(config_, next, now, cost);
    }
    if (d.allowed && cost > 0) {
      state_.emplace(std::move(next));
      DropIfFresh(now);
    }
    return d;
  }
  Decision Check(Time now, int64_t cost) const {
    State copy = state_ ? A::Copy(*state_) : State{};
    return A::Step(config_, copy, now, cost);
  }
  // Whether named slots were found (counted: true).
  bool Refund(Time now, Time taken_at, int64_t cost, uint64_t slot = 0) {
    if (!state_ || std::is_same_v<Config, LeakyShapeConfig>) return false;
    bool found = true;
    if constexpr (kNamed) {
      if (slot != 0) {
        found = Release(config_, *state_, taken_at, slot);
      } else {
        A::GiveBack(config_, *state_, taken_at, cost);
      }
    } else {
      A::GiveBack(config_, *state_, taken_at, cost);
    }
    DropIfFresh(now);
    return found;
  }
  // A settled charge: taken whether or not it fits (debt), by the
  // algorithms that carry debt; nothing by the others.
  void Charge(Time now, int64_t cost) {
    if (!kCharges<Config> || cost <= 0) return;
    State next = state_ ? A::Copy(*state_) : State{};
    ChargeInPlace(config_, next, now, cost);
    state_.emplace(std::move(next));
    DropIfFresh(now);
  }
  // The store's renew: the refund, then the decide, as one step.
  // Named slots not held are lost: denied, nothing taken.
  Decision Renew(Time now, Time taken_at, int64_t cost, uint64_t slot = 0) {
    if (!Refund(now, taken_at, cost, slot) && slot != 0) {
      Decision lost = Check(now, cost);
      lost.allowed = false;
      return lost;
    }
    return Decide(now, cost, slot);
  }
  std::vector<std::string> Encoded() const {
    if (!state_) return {};
    return Encode(config_, *state_);
  }

 private:
  void DropIfFresh(Time now) {
    if (A::FreshTime(config_, *state_) <= now) state_.reset();
  }

  static constexpr bool kNamed = std::is_same_v<Config, ConcurrencyConfig>;
  Config config_;
  std::optional<State> state_;
};

// ---- ops ----

struct Op {
  ScriptOp kind = ScriptOp::kDecide;
  Time now;
  int64_t cost = 1;
  Time taken_at;      // kRefund, kRenew
  uint64_t slot = 0;  // a concurrency limit's named slots (kDecide, kRefund, kRenew)
};

std::string OpString(const Op& op) {
  const char* kind = op.kind == ScriptOp::kDecide   ? "decide"
                     : op.kind == ScriptOp::kCheck  ? "check"
                     : op.kind == ScriptOp::kRenew  ? "renew"
                     : op.kind == ScriptOp::kCharge ? "charge"
                                                    : "refund";
  std::string s = std::string(kind) + " cost " + std::to_string(op.cost) + " at " +
                  std::to_string(op.now.unix_micros()) + "us";
  if (op.kind == ScriptOp::kRefund || op.kind == ScriptOp::kRenew)
    s += " taken at " + std::to_string(op.taken_at.unix_micros());
  if (op.slot != 0) s += " slot " + std::to_string(op.slot);
  return s;
}

int64_t CapacityOf(const LimitConfig& config) {
  return std::visit([](const auto& c) { return Algo<std::decay_t<decltype(c)>>::Capacity(c); },
                    config);
}

// The edges, in order: a fresh key emptied at one instant (with the cost
// above capacity, the capacity, 1 and a peek), 1us steps, one interval, the
// next window boundary and its neighbours, a refund, the clock back by 1us
// and by a period, back to near the epoch, a year ahead, and 2070.
std::vector<Op> EdgeOps(const LimitConfig& config) {
  const Rate rate = RateOf(config);
  const int64_t period = rate.period.micros();
  const int64_t capacity = CapacityOf(config);
  const int64_t interval = std::max<int64_t>(1, period / rate.limit);
  const Time t0 = kTraceOrigin + Duration::Micros(period / 3);
  const Time boundary = Time::FromUnixMicros((t0.unix_micros() / period + 1) * period);
  std::vector<Op> ops;
  auto decide = [&](Time at, int64_t cost) { ops.push_back({ScriptOp::kDecide, at, cost, {}}); };
  decide(t0, capacity + 1);
  decide(t0, capacity);
  decide(t0, 1);
  decide(t0, 0);
  ops.push_back({ScriptOp::kCheck, t0, 1, {}});
  ops.push_back({ScriptOp::kRefund, t0, 1, t0});
  decide(t0, 1);
  ops.push_back({ScriptOp::kRenew, t0 + Duration::Micros(1), 1, t0});
  decide(t0 + Duration::Micros(1), 1);
  decide(t0 + Duration::Micros(2), 2);
  decide(t0 + Duration::Micros(interval), 1);
  decide(t0 + Duration::Micros(interval + 1), 1);
  for (int64_t d : {-1, 0, 1}) decide(boundary + Duration::Micros(d), 1);
  decide(boundary + Duration::Micros(1), capacity);
  ops.push_back({ScriptOp::kRefund, boundary + Duration::Micros(2), 1, boundary});
  decide(boundary, 1);                             // back by 1us
  decide(boundary - Duration::Micros(period), 1);  // back by a period
  ops.push_back({ScriptOp::kCheck, kNearEpoch, 1, {}});
  decide(kNearEpoch, 1);  // back by 54 years
  decide(boundary + Duration::Micros(interval), capacity);
  decide(boundary + Duration::Days(365), capacity);
  decide(boundary + Duration::Days(365), 1);
  decide(kYear2070, capacity);
  decide(kYear2070, 1);
  ops.push_back({ScriptOp::kRefund, kYear2070, capacity, kYear2070});
  decide(kYear2070, 1);
  // Debt: three capacities over, repaid across windows; then the most a
  // call sends (2^52), which saturates.
  ops.push_back({ScriptOp::kCharge, kYear2070, 3 * capacity, {}});
  decide(kYear2070 + Duration::Micros(interval), 1);
  decide(kYear2070 + Duration::Micros(period), 1);
  decide(kYear2070 + Duration::Micros(3 * period), 1);
  decide(kYear2070 + Duration::Micros(5 * period), 1);
  ops.push_back(
      {ScriptOp::kCharge, kYear2070 + Duration::Micros(5 * period), int64_t{1} << 52, {}});
  decide(kYear2070 + Duration::Micros(6 * period), 1);
  ops.push_back({ScriptOp::kCheck, kYear2070 + Duration::Micros(7 * period), 1, {}});
  if (std::holds_alternative<ConcurrencyConfig>(config)) {
    // Named slots: two at one instant stay apart (and a counted take after
    // them), a release given twice finds nothing the second time, a renew
    // of released slots is lost, a renew of held ones keeps their name.
    const Time t = kYear2070 + Duration::Micros(9 * period);
    const auto us = [&](int64_t n) { return t + Duration::Micros(n); };
    ops.push_back({ScriptOp::kDecide, t, 1, {}, 11});
    ops.push_back({ScriptOp::kDecide, t, 1, {}, 12});
    ops.push_back({ScriptOp::kDecide, t, 1, {}, 0});
    ops.push_back({ScriptOp::kRefund, us(1), 1, t, 11});
    ops.push_back({ScriptOp::kRefund, us(2), 1, t, 11});
    ops.push_back({ScriptOp::kRenew, us(3), 1, t, 11});
    ops.push_back({ScriptOp::kRenew, us(4), 1, t, 12});
    ops.push_back({ScriptOp::kRefund, us(5), 1, t, 12});
    ops.push_back({ScriptOp::kDecide, us(6), 2, {}, ~uint64_t{0}});
    ops.push_back({ScriptOp::kRefund, us(7), 2, us(6), ~uint64_t{0}});
  }
  return ops;
}

// Random decides, checks and refunds over the rate's time scale: the
// conformance traces' gaps (Poisson, same instant, 1us, idle periods,
// boundaries, steps back), plus idle days and decades and steps back by
// days. Refunds mostly give back a recent take, as the limiter does.
std::vector<Op> RandomOps(uint64_t seed, const LimitConfig& config, int steps) {
  TraceRng rng(seed);
  conformance::TraceOptions options;
  options.rate = RateOf(config);
  options.capacity = CapacityOf(config);
  options.steps_back = true;
  std::deque<Op> takes;
  std::vector<Op> ops;
  // A concurrency limit's takes are mostly named: random slots, the most
  // a name can be among them.
  const bool named = std::holds_alternative<ConcurrencyConfig>(config);
  auto slot = [&] {
    if (!named || rng.Chance(0.2)) return uint64_t{0};
    return rng.Chance(0.1) ? ~uint64_t{0} : static_cast<uint64_t>(rng.Uniform(1, INT64_MAX));
  };
  int64_t now = kTraceOrigin.unix_micros() + rng.Uniform(0, options.rate.period.micros() - 1);
  for (int i = 0; i < steps; ++i) {
    const int64_t r = rng.Uniform(0, 999);
    if (r < 10) {
      now += rng.Uniform(1, 1000) * Duration::Days(1).micros();
    } else if (r < 13) {
      now += rng.Uniform(10, 40) * Duration::Days(365).micros();
    } else if (r < 18) {
      now -= rng.Uniform(1, 1000) * Duration::Days(1).micros();
    } else if (i > 0) {
      now = conformance::NextTime(rng, now, options);
    }
    now = std::clamp(now, kNearEpoch.unix_micros(), kYear2070.unix_micros());
    const Time at = Time::FromUnixMicros(now);
    const int64_t kind = rng.Uniform(0, 99);
    if (kind < 10) {
      ops.push_back({ScriptOp::kCheck, at, conformance::NextCost(rng, options.capacity), {}});
    } else if (kind < 22 && !takes.empty()) {
      const Op& take = takes[rng.Uniform(0, static_cast<int64_t>(takes.size()) - 1)];
      const int64_t cost = rng.Chance(0.8) ? take.cost : rng.Uniform(0, 3);
      ops.push_back({ScriptOp::kRefund, at, cost, take.now, take.slot});
    } else if (kind < 25) {
      const Time taken_at = at - Duration::Micros(rng.Uniform(0, 2 * options.rate.period.micros()));
      ops.push_back({ScriptOp::kRefund, at, rng.Uniform(0, 3), taken_at});
    } else if (kind < 32 && kind >= 29) {
      // A settled difference charged: up to a few capacities over.
      ops.push_back({ScriptOp::kCharge, at, rng.Uniform(0, 3 * options.capacity + 3), {}});
    } else if (kind < 29 && !takes.empty()) {
      // A renew of a recent take, which is then taken again now.
      Op& take = takes[rng.Uniform(0, static_cast<int64_t>(takes.size()) - 1)];
      ops.push_back({ScriptOp::kRenew, at, take.cost, take.now, take.slot});
      take.now = at;
    } else {
      const Op op{ScriptOp::kDecide, at, conformance::NextCost(rng, options.capacity), {}, slot()};
      ops.push_back(op);
      if (op.cost > 0) {
        takes.push_back(op);
        if (takes.size() > 8) takes.pop_front();
      }
    }
  }
  return ops;
}

// ---- the parity run ----

struct NamedLimit {
  std::string name;
  LimitOptions options;
};

std::ostream& operator<<(std::ostream& os, const NamedLimit& c) { return os << c.name; }

LimitOptions Bucket(Algorithm algorithm, std::string_view rate, int64_t burst = 0) {
  LimitOptions options;
  options.algorithm = algorithm;
  options.rate = *ParseRate(rate);
  options.burst = burst;
  return options;
}
LimitOptions Shape(std::string_view rate, Duration max_delay, int64_t queue) {
  LimitOptions options = Bucket(Algorithm::kLeakyBucket, rate);
  options.mode = LeakyMode::kShape;
  options.max_delay = max_delay;
  options.queue = queue;
  return options;
}
LimitOptions Window(Algorithm algorithm, std::string_view rate) { return Bucket(algorithm, rate); }

std::vector<NamedLimit> ParityConfigs() {
  std::vector<NamedLimit> out;
  const std::pair<Algorithm, std::string> buckets[] = {{Algorithm::kTokenBucket, "token_bucket"},
                                                       {Algorithm::kGcra, "gcra"}};
  for (const auto& [algorithm, name] : buckets) {
    out.push_back({name + "_3per250ms", Bucket(algorithm, "3/250ms")});
    out.push_back({name + "_7perMin_burst1", Bucket(algorithm, "7/min", 1)});
    out.push_back({name + "_100perS_burst20", Bucket(algorithm, "100/s", 20)});
    out.push_back({name + "_1perH", Bucket(algorithm, "1/h")});
    out.push_back({name + "_1000000per999us", Bucket(algorithm, "1000000/999us")});
    out.push_back({name + "_2000perUs_burst1000", Bucket(algorithm, "2000/us", 1000)});
    // 26000 x 86,400,000,000 ticks: just below the 2^51 bound.
    out.push_back({name + "_7perDay_burst26000", Bucket(algorithm, "7/day", 26000)});
  }
  LimitOptions police = Bucket(Algorithm::kLeakyBucket, "3/250ms");
  out.push_back({"leaky_police_3per250ms", police});
  out.push_back({"leaky_police_7perMin_burst1", Bucket(Algorithm::kLeakyBucket, "7/min", 1)});
  out.push_back({"leaky_police_100perS_burst20", Bucket(Algorithm::kLeakyBucket, "100/s", 20)});
  out.push_back({"leaky_police_1perH", Bucket(Algorithm::kLeakyBucket, "1/h")});
  out.push_back(
      {"leaky_police_7perDay_burst26000", Bucket(Algorithm::kLeakyBucket, "7/day", 26000)});
  out.push_back({"leaky_shape_3per250ms", Shape("3/250ms", Duration::Zero(), 0)});
  out.push_back({"leaky_shape_3per250ms_queue4", Shape("3/250ms", Duration::Zero(), 4)});
  out.push_back({"leaky_shape_7perS_maxDelay2s", Shape("7/s", Duration::Seconds(2), 0)});
  out.push_back(
      {"leaky_shape_40perMin_maxDelay30s_queue5", Shape("40/min", Duration::Seconds(30), 5)});
  out.push_back({"leaky_shape_100perS_queue20", Shape("100/s", Duration::Zero(), 20)});
  out.push_back({"leaky_shape_2000perUs_queue1000", Shape("2000/us", Duration::Zero(), 1000)});
  out.push_back({"leaky_shape_7perMin_maxDelay1d", Shape("7/min", Duration::Days(1), 0)});
  const std::pair<Algorithm, std::string> windows[] = {
      {Algorithm::kFixedWindow, "fixed_window"},
      {Algorithm::kSlidingLog, "sliding_log"},
      {Algorithm::kSlidingWindow, "sliding_window"}};
  for (const auto& [algorithm, name] : windows) {
    out.push_back({name + "_3per250ms", Window(algorithm, "3/250ms")});
    out.push_back({name + "_7perMin", Window(algorithm, "7/min")});
    out.push_back({name + "_100perS", Window(algorithm, "100/s")});
    out.push_back({name + "_1perH", Window(algorithm, "1/h")});
  }
  out.push_back({"sliding_log_1000perDay", Window(Algorithm::kSlidingLog, "1000/day")});
  // Concurrency: the sliding log with the lease TTL as its period.
  for (const auto& [slots, ttl, name] :
       {std::tuple{int64_t{3}, Duration::Millis(250), "concurrency_3_ttl250ms"},
        std::tuple{int64_t{100}, Duration::Seconds(60), "concurrency_100_ttl1m"}}) {
    LimitOptions options;
    options.algorithm = Algorithm::kConcurrency;
    options.rate.limit = slots;
    options.lease_ttl = ttl;
    out.push_back({name, options});
  }
  // limit x period = 2^40 x 366 days, about 2^85: the products muldiv forms.
  out.push_back(
      {"sliding_window_2pow40per366d", Window(Algorithm::kSlidingWindow, "1099511627776/366d")});
  out.push_back(
      {"fixed_window_2pow40per366d", Window(Algorithm::kFixedWindow, "1099511627776/366d")});
  return out;
}

class ScriptParityTest : public RedisTest, public ::testing::WithParamInterface<NamedLimit> {
 protected:
  // Runs `ops` through both sides; stops at the first difference.
  template <typename Config>
  void Run(const Config& config, const std::vector<Op>& ops) {
    const std::string params = LimitParams(LimitConfig(config));
    const std::string key = "{parity}:" + GetParam().name;
    Command({"DEL", key});
    Twin<Config> twin(config);
    const bool list = std::is_base_of_v<SlidingLogConfig, Config>;
    const std::string_view keys[] = {key};
    const std::string_view limits[] = {params};
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const CallPart part = EncodePart(
          {.op = op.kind, .now = op.now, .cost = op.cost, .taken_at = op.taken_at, .slot = op.slot},
          keys, limits);
      const std::string command = JoinParts({&part, 1});
      // One round trip: the function, then the key it left.
      redisAppendFormattedCommand(context_, command.data(), command.size());
      if (list) {
        redisAppendCommand(context_, "LRANGE %b 0 -1", key.data(), key.size());
      } else {
        redisAppendCommand(context_, "GET %b", key.data(), key.size());
      }
      void* raw = nullptr;
      ASSERT_EQ(redisGetReply(context_, &raw), REDIS_OK);
      Reply script(static_cast<redisReply*>(raw));
      ASSERT_EQ(redisGetReply(context_, &raw), REDIS_OK);
      Reply stored(static_cast<redisReply*>(raw));

      absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> results =
          ParseCallReply(*script, {&part, 1});
      ASSERT_TRUE(results.ok()) << "op " << i << " (" << OpString(op) << "): " << results.status();
      absl::StatusOr<ScriptResult>& result = results->front();
      ASSERT_TRUE(result.ok()) << "op " << i << " (" << OpString(op) << "): " << result.status();
      ASSERT_EQ(result->now, op.now);
      if (op.kind == ScriptOp::kDecide) {
        const Decision want = twin.Decide(op.now, op.cost, op.slot);
        ASSERT_TRUE(SameDecision(result->decisions[0], want)) << "op " << i << ": " << OpString(op);
      } else if (op.kind == ScriptOp::kCheck) {
        const Decision want = twin.Check(op.now, op.cost);
        ASSERT_TRUE(SameDecision(result->decisions[0], want)) << "op " << i << ": " << OpString(op);
      } else if (op.kind == ScriptOp::kCharge) {
        twin.Charge(op.now, op.cost);
      } else if (op.kind == ScriptOp::kRenew) {
        const Decision want = twin.Renew(op.now, op.taken_at, op.cost, op.slot);
        ASSERT_TRUE(SameDecision(result->decisions[0], want)) << "op " << i << ": " << OpString(op);
      } else {
        twin.Refund(op.now, op.taken_at, op.cost, op.slot);
      }
      std::vector<std::string> held;
      if (stored->type == REDIS_REPLY_STRING) {
        held.emplace_back(Text(*stored));
      } else if (stored->type == REDIS_REPLY_ARRAY) {
        for (size_t e = 0; e < stored->elements; ++e) held.emplace_back(Text(*stored->element[e]));
      } else {
        ASSERT_EQ(stored->type, REDIS_REPLY_NIL) << Text(*stored);
      }
      ASSERT_EQ(held, twin.Encoded()) << "the state after op " << i << ": " << OpString(op);
    }
  }

  template <typename Visitor>
  void WithConfig(Visitor visit) {
    absl::StatusOr<LimitConfig> config = MakeLimit(GetParam().options);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(ValidateForRedis(*config).ok()) << ValidateForRedis(*config);
    std::visit([&](const auto& c) { visit(c, *config); }, *config);
  }
};

// One test per config: the edge sequence, then two random ones (a third
// as long under the sanitizers: a Redis call per step, and the same code
// checked on every step).
TEST_P(ScriptParityTest, EdgesAndRandomSequences) {
  WithConfig([&](const auto& c, const LimitConfig& config) {
    {
      SCOPED_TRACE("edge sequence");
      Run(c, EdgeOps(config));
      if (HasFatalFailure()) return;
    }
    for (uint64_t seed : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "random sequence, seed " << seed);
      Run(c, RandomOps(seed, config, ::sluice::testing::kSanitized ? 500 : 1500));
      if (HasFatalFailure()) return;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, ScriptParityTest, ::testing::ValuesIn(ParityConfigs()),
                         [](const ::testing::TestParamInfo<NamedLimit>& info) {
                           return info.param.name;
                         });

// ---- tables a reader can check by hand (docs/algorithms.md) ----

class ScriptTableTest : public RedisTest {
 protected:
  struct Row {
    int64_t at_ms;
    bool allowed;
    int64_t remaining;
    int64_t retry_after_ms;
    int64_t reset_after_ms;
    int64_t delay_ms;
  };
  void ExpectTable(const LimitOptions& options, const std::vector<Row>& rows) {
    const LimitConfig config = *MakeLimit(options);
    const std::string params[] = {LimitParams(config)};
    const std::string_view keys[] = {"{table}:k"};
    for (const Row& row : rows) {
      const Time at = kTraceOrigin + Duration::Millis(row.at_ms);
      absl::StatusOr<ScriptResult> r =
          Run({.op = ScriptOp::kDecide, .now = at, .cost = 1}, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      const Decision& d = r->decisions[0];
      SCOPED_TRACE(::testing::Message() << "at " << row.at_ms << "ms: " << DebugString(d));
      EXPECT_EQ(d.allowed, row.allowed);
      EXPECT_EQ(d.remaining, row.remaining);
      EXPECT_EQ(d.retry_after, Duration::Millis(row.retry_after_ms));
      EXPECT_EQ(d.reset_after, Duration::Millis(row.reset_after_ms));
      EXPECT_EQ(d.delay, Duration::Millis(row.delay_ms));
    }
  }
};

TEST_F(ScriptTableTest, TokenBucketTwoPerSecondBurstFour) {
  ExpectTable(Bucket(Algorithm::kTokenBucket, "2/s", 4), {{0, true, 3, 0, 500, 0},
                                                          {100, true, 2, 0, 900, 0},
                                                          {200, true, 1, 0, 1300, 0},
                                                          {300, true, 0, 0, 1700, 0},
                                                          {400, false, 0, 100, 1600, 0},
                                                          {500, true, 0, 0, 2000, 0},
                                                          {600, false, 0, 400, 1900, 0},
                                                          {700, false, 0, 300, 1800, 0}});
}

TEST_F(ScriptTableTest, LeakyShapeTwoPerSecondQueueThree) {
  ExpectTable(Shape("2/s", Duration::Zero(), 3), {{0, true, 3, 0, 500, 0},
                                                  {0, true, 2, 0, 1000, 500},
                                                  {0, true, 1, 0, 1500, 1000},
                                                  {0, true, 0, 0, 2000, 1500},
                                                  {0, false, 0, 500, 2000, 0},
                                                  {0, false, 0, 500, 2000, 0}});
}

TEST_F(ScriptTableTest, FixedWindowAdmitsTwoLimitsAcrossABoundary) {
  // 4/min: 4 at 0:59 and 4 more at 1:00, the boundary burst the docs show.
  std::vector<Row> rows;
  for (int i = 0; i < 4; ++i) rows.push_back({59'000, true, 3 - i, 0, 1'000, 0});
  rows.push_back({59'500, false, 0, 500, 500, 0});
  for (int i = 0; i < 4; ++i) rows.push_back({60'000, true, 3 - i, 0, 60'000, 0});
  ExpectTable(Window(Algorithm::kFixedWindow, "4/min"), rows);
}

}  // namespace
}  // namespace sluice::redis
