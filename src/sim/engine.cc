// The event loop. Three kinds of event move a request: an arrival from a
// traffic source (its first try), a retry (a rejected request coming back),
// and a release (a shaped request leaving the limiter after its delay). All
// wait in one queue taken in order of (time, sequence number), a calendar of
// small buckets (event_queue.h); a traffic source keeps exactly one pending
// arrival in it, generating the next when that one runs, so memory stays
// proportional to the requests in flight, not to the traffic.
//
// Budget: the loop allocates nothing per request once its vectors have grown
// to the run's high-water mark; the per-request cost is one push and pop
// (into a 128 us bucket, sorted once when it comes up; none at all for an
// arrival that is due next anyway), one Decide, and a handful of array
// updates. bench/sim_bench.cc measures it.
#include "sim/engine.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "base/cat.h"
#include "sim/event_queue.h"
#include "sim/random.h"
#include "sim/stats.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"

namespace sluice::sim {
namespace {

using internal::Cat;

// Stream numbers for Rng::Stream: sources take 0, 1, 2, ...
constexpr uint64_t kServerJitterStream = 1'000'001;
constexpr uint64_t kClientJitterStream = 1'000'002;
constexpr uint64_t kServiceStream = 1'000'003;

// ---- gates: who decides ----

struct Answer {
  Decision decision;
  size_t limit_index = 0;  // which limit decided (its period sets the default jitter)
};

class Gate {
 public:
  virtual ~Gate() = default;
  // `state` is the instance for local state, 0 for shared.
  virtual Answer Decide(size_t state, uint32_t key, Time now) = 0;
  // A request admitted at `taken_at` is done: its concurrency slots go back.
  virtual void Done(size_t state, uint32_t key, Time taken_at) = 0;
  // Whether admitted requests hold slots until Done (a concurrency limit).
  virtual bool holds() const = 0;
  absl::Status status;  // the first error, if a store ever reports one
};

// One limit: the algorithm's pure Decide on a dense array of states, the
// same call the memory store makes in its key's cell.
template <typename Config>
class DirectGate final : public Gate {
 public:
  DirectGate(const Config& config, size_t states, size_t keys)
      : config_(config), keys_(keys), states_(states * keys) {}

  Answer Decide(size_t state, uint32_t key, Time now) override {
    return {DecideInPlace(config_, states_[state * keys_ + key], now, 1), 0};
  }
  void Done(size_t state, uint32_t key, Time taken_at) override {
    if constexpr (std::is_same_v<Config, ConcurrencyConfig>) {
      RefundInPlace(config_, states_[state * keys_ + key], taken_at, 1);
    }
  }
  bool holds() const override { return std::is_same_v<Config, ConcurrencyConfig>; }

 private:
  Config config_;
  size_t keys_;
  std::vector<StateOf_t<Config>> states_;
};

// Several limits: sluice::Limiter on a MemoryStore per state, exactly as a
// policy in `sluice serve` (all-or-nothing, shape last, most restrictive
// answer), reading the simulation's manual clock.
class LimiterGate final : public Gate {
 public:
  static absl::StatusOr<std::unique_ptr<LimiterGate>> Create(const LimiterSetup& setup,
                                                             size_t states,
                                                             std::vector<std::string> keys,
                                                             const ManualClock& clock) {
    auto gate = std::unique_ptr<LimiterGate>(new LimiterGate());
    gate->keys_ = std::move(keys);
    const int64_t max_keys = static_cast<int64_t>(gate->keys_.size() * setup.limits.size()) + 1024;
    for (size_t i = 0; i < states; ++i) {
      gate->stores_.push_back(
          std::make_unique<MemoryStore>(MemoryStoreOptions{.max_keys = max_keys}));
      absl::StatusOr<std::unique_ptr<Limiter>> limiter = Limiter::Create(
          *gate->stores_.back(), {.name = setup.name, .limits = setup.limits, .clock = &clock});
      if (!limiter.ok()) return limiter.status();
      gate->limiters_.push_back(*std::move(limiter));
    }
    return gate;
  }

  Answer Decide(size_t state, uint32_t key, Time now) override {
    // `now` is the manual clock's, which the loop set: what Acquire would read.
    absl::StatusOr<PolicyDecision> d = limiters_[state]->AcquireAt(keys_[key], now, 1);
    if (!d.ok()) {
      if (status.ok()) status = d.status();
      return {Decision{.retry_after = Duration::Infinite()}, 0};
    }
    return {*d, d->limit_index};
  }
  void Done(size_t state, uint32_t key, Time taken_at) override {
    PolicyDecision taken;
    taken.allowed = true;
    taken.taken_at = taken.store_time = taken_at;
    if (absl::Status s = limiters_[state]->Release(keys_[key], taken, 1); !s.ok() && status.ok()) {
      status = s;
    }
  }
  bool holds() const override { return limiters_.front()->holds(); }

 private:
  LimiterGate() = default;
  std::vector<std::string> keys_;
  std::vector<std::unique_ptr<MemoryStore>> stores_;
  std::vector<std::unique_ptr<Limiter>> limiters_;
};

absl::StatusOr<std::unique_ptr<Gate>> MakeGate(const LimiterSetup& setup, size_t states,
                                               const std::vector<std::string>& keys,
                                               const ManualClock& clock) {
  if (setup.limits.size() > 1) {
    absl::StatusOr<std::unique_ptr<LimiterGate>> gate =
        LimiterGate::Create(setup, states, keys, clock);
    if (!gate.ok()) return gate.status();
    return std::unique_ptr<Gate>(*std::move(gate));
  }
  absl::StatusOr<LimitConfig> config = MakeLimit(setup.limits.front());
  if (!config.ok()) return config.status();
  return std::visit(
      [&](const auto& c) -> std::unique_ptr<Gate> {
        using Config = std::decay_t<decltype(c)>;
        return std::make_unique<DirectGate<Config>>(c, states, keys.size());
      },
      *config);
}

// ---- traffic sources ----

// floor(total * i / parts) for i = 0, 1, 2, ...: a quotient and a
// remainder carried from one to the next, no division each.
class EvenSteps {
 public:
  EvenSteps() = default;
  // REQUIRES: total >= 0, parts > 0.
  EvenSteps(int64_t total, int64_t parts)
      : step_q_(total / parts), step_r_(total % parts), parts_(parts) {}
  int64_t current() const { return q_; }
  void Advance() {
    q_ += step_q_;
    r_ += step_r_;
    if (r_ >= parts_) {
      r_ -= parts_;
      ++q_;
    }
  }

 private:
  int64_t q_ = 0, r_ = 0;
  int64_t step_q_ = 0, step_r_ = 0, parts_ = 1;
};

struct Source {
  const Arrival* arrival = nullptr;
  uint32_t group = 0;
  Rng rng{0};
  int64_t index = 0;    // arrivals generated so far
  EvenSteps offset;     // burst, constant: the next arrival's time from `from`
  double clock_us = 0;  // poisson, diurnal: the process's own time
  int64_t until_us = 0;
  int64_t round_robin = 0;  // burst, constant: the next client, in turn
};

// The next arrival's time, or -1 when the source is done.
int64_t NextArrival(Source& s) {
  const Arrival& a = *s.arrival;
  switch (a.kind) {
    case ArrivalKind::kBurst: {
      if (s.index >= a.count) return -1;  // spread * index / count
      const int64_t t = a.from.micros() + s.offset.current();
      s.offset.Advance();
      ++s.index;
      return t;
    }
    case ArrivalKind::kConstant: {
      const int64_t t = a.from.micros() + s.offset.current();  // period * index / limit
      if (t >= s.until_us) return -1;
      s.offset.Advance();
      ++s.index;
      return t;
    }
    case ArrivalKind::kPoisson: {
      const double mean_us =
          static_cast<double>(a.rate.period.micros()) / static_cast<double>(a.rate.limit);
      s.clock_us += s.rng.Exponential(mean_us);
      if (s.clock_us >= static_cast<double>(s.until_us)) return -1;
      ++s.index;
      return static_cast<int64_t>(s.clock_us);
    }
    case ArrivalKind::kDiurnal: {
      // Thinning: candidates at the peak rate, each kept with probability
      // rate(t) / peak, a Poisson process of rate(t).
      const double high =
          static_cast<double>(a.rate.limit) / static_cast<double>(a.rate.period.micros());
      const double low =
          static_cast<double>(a.low.limit) / static_cast<double>(a.low.period.micros());
      const double cycle = static_cast<double>(a.cycle.micros());
      while (true) {
        s.clock_us += s.rng.Exponential(1.0 / high);
        if (s.clock_us >= static_cast<double>(s.until_us)) return -1;
        const double phase = (s.clock_us - static_cast<double>(a.peak_at.micros())) / cycle;
        const double rate = low + (high - low) * (1 + std::cos(2 * std::numbers::pi * phase)) / 2;
        if (s.rng.Uniform01() * high < rate) break;
      }
      ++s.index;
      return static_cast<int64_t>(s.clock_us);
    }
  }
  return -1;
}

// ---- the run ----

// The first limit with a rate (a concurrency limit has none); none: a zero
// rate, and the run measures no contract.
Rate ContractOf(const LimiterSetup& setup) {
  for (const LimitOptions& limit : setup.limits) {
    if (limit.algorithm != Algorithm::kConcurrency) return limit.rate;
  }
  return Rate{};
}

class Engine {
 public:
  Engine(const Scenario& scenario, const LimiterSetup& setup, uint64_t seed)
      : scenario_(scenario),
        setup_(setup),
        seed_(seed),
        clock_(Time::UnixEpoch() + scenario.clock_start),
        server_rng_(Rng::Stream(seed, kServerJitterStream)),
        client_rng_(Rng::Stream(seed, kClientJitterStream)),
        service_rng_(Rng::Stream(seed, kServiceStream)),
        per_second_(Duration::Seconds(1)),
        contract_(scenario.contract ? *scenario.contract : ContractOf(setup)) {}

  absl::StatusOr<LimiterRun> Execute();

 private:
  enum class Kind : uint8_t { kArrival, kRetry, kRelease, kDone };
  struct Event {
    int64_t time_us;
    uint64_t seq;
    int64_t first_us;  // the request's first try
    int64_t taken_us;  // kRelease, kDone: when it was admitted
    uint32_t state;    // kRelease, kDone: the state (instance) that admitted it
    uint32_t client;   // within its group; for kArrival: the source index
    uint32_t key;
    uint32_t attempt;  // tries so far, this one included
    uint16_t group;
    Kind kind;
  };
  // `e` with the next sequence number: its place among events of its time.
  Event Numbered(Event e) {
    e.seq = next_seq_++;
    return e;
  }
  void Push(const Event& e) { queue_.Push(Numbered(e)); }

  uint32_t KeyOf(uint32_t group, uint32_t client) const {
    switch (scenario_.groups[group].key) {
      case KeyMode::kClient:
        return key_base_[group] + client;
      case KeyMode::kGroup:
        return key_base_[group];
      case KeyMode::kGlobal:
        return global_key_;
    }
    return 0;
  }

  absl::Status Setup();
  void Attempt(const Event& e);
  // An admitted request leaves the limiter (after any shaping delay) for the
  // downstream or its service time.
  void Release(int64_t t_us, const Event& admitted);
  // It is done: it leaves the flight, and gives back its slots.
  void Done(const Event& e);
  int64_t ServiceMicros();
  // How long a rejected request waits before its next try; -1: given up.
  int64_t RetryWait(const RetryPolicy& policy, uint32_t attempt, const Answer& answer);
  LimiterRun Finish();

  const Scenario& scenario_;
  const LimiterSetup& setup_;
  uint64_t seed_;
  ManualClock clock_;
  Rng server_rng_;
  Rng client_rng_;
  Rng service_rng_;
  HoldAverage holds_;               // what `sluice serve` caps a concurrency denial's wait at
  std::vector<int64_t> in_flight_;  // per key: admitted, not yet done

  std::vector<uint32_t> key_base_;     // per group
  std::vector<uint32_t> client_base_;  // per group: index of its first client overall
  uint32_t global_key_ = 0;
  std::vector<std::string> key_names_;
  size_t key_count_ = 0;
  std::unique_ptr<Gate> gate_;
  size_t states_ = 1;
  std::vector<Source> sources_;
  EventQueue<Event> queue_;
  uint64_t next_seq_ = 0;
  int64_t round_robin_ = 0;
  int64_t duration_us_ = 0;

  // Downstream: completes one request per capacity.period / capacity.limit,
  // in order. Times scaled by capacity.limit keep that exact in integers.
  int64_t next_free_scaled_ = 0;

  // Measurements.
  LimiterRun run_;
  std::vector<int64_t> offered_s_, admitted_s_, rejected_s_, retries_s_;  // per second
  RollingMax per_second_;
  Rate contract_;
  std::vector<RollingMax> per_key_period_;
  Histogram delay_;
  Histogram latency_;
  int64_t first_retry_us_ = -1, last_retry_us_ = -1;
  int64_t last_completion_us_ = -1;
};

absl::Status Engine::Setup() {
  duration_us_ = scenario_.duration.micros();
  // Keys: client keys first, group by group, then the one global key.
  bool any_global = false;
  uint32_t clients = 0;
  for (const ClientGroup& g : scenario_.groups) {
    key_base_.push_back(static_cast<uint32_t>(key_count_));
    client_base_.push_back(clients);
    clients += static_cast<uint32_t>(g.clients);
    switch (g.key) {
      case KeyMode::kClient:
        for (int64_t i = 0; i < g.clients; ++i) key_names_.push_back(Cat(g.name, "-", i));
        key_count_ += static_cast<size_t>(g.clients);
        break;
      case KeyMode::kGroup:
        key_names_.push_back(g.name);
        ++key_count_;
        break;
      case KeyMode::kGlobal:
        any_global = true;
        break;
    }
  }
  if (any_global) {
    global_key_ = static_cast<uint32_t>(key_count_);
    key_names_.push_back("*");
    ++key_count_;
  }
  if (key_count_ == 0) key_count_ = 1;  // no clients: nothing will be decided
  if (key_names_.empty()) key_names_.push_back("*");

  states_ = setup_.scope == StateScope::kShared ? 1 : static_cast<size_t>(scenario_.instances);
  absl::StatusOr<std::unique_ptr<Gate>> gate = MakeGate(setup_, states_, key_names_, clock_);
  if (!gate.ok()) return gate.status();
  gate_ = *std::move(gate);
  if (setup_.limits.size() == 1) key_names_.clear();  // only the limiter needs them
  const Duration period =
      contract_.period > Duration::Zero() ? contract_.period : Duration::Seconds(1);
  per_key_period_.reserve(key_count_);
  for (size_t k = 0; k < key_count_; ++k) per_key_period_.emplace_back(period);
  in_flight_.assign(key_count_, 0);

  const size_t seconds = static_cast<size_t>((duration_us_ + 999'999) / 1'000'000);
  for (auto* v : {&offered_s_, &admitted_s_, &rejected_s_, &retries_s_}) v->assign(seconds, 0);

  uint64_t stream = 0;
  for (uint32_t g = 0; g < scenario_.groups.size(); ++g) {
    for (const Arrival& a : scenario_.groups[g].traffic) {
      Source s;
      s.arrival = &a;
      s.group = g;
      s.rng = Rng(Rng::Stream(seed_, stream++));
      s.clock_us = static_cast<double>(a.from.micros());
      if (a.kind == ArrivalKind::kBurst && a.count > 0) {
        s.offset = EvenSteps(a.spread.micros(), a.count);
      } else if (a.kind == ArrivalKind::kConstant) {
        s.offset = EvenSteps(a.rate.period.micros(), a.rate.limit);
      }
      const int64_t until = a.until > Duration::Zero() ? a.until.micros() : duration_us_;
      s.until_us = std::min(until, duration_us_);
      sources_.push_back(s);
    }
  }
  for (uint32_t i = 0; i < sources_.size(); ++i) {
    const int64_t t = NextArrival(sources_[i]);
    if (t >= 0) Push({.time_us = t, .client = i, .kind = Kind::kArrival});
  }
  run_.name = setup_.name;
  for (const LimitOptions& l : setup_.limits) {
    run_.limits += Cat(run_.limits.empty() ? "" : "; ", DescribeLimit(l));
  }
  run_.contract = contract_;
  return absl::OkStatus();
}

absl::StatusOr<LimiterRun> Engine::Execute() {
  if (absl::Status s = Setup(); !s.ok()) return s;
  Event e{};
  bool next_ready = false;  // `e` is the next event already: no push and pop
  while (next_ready || !queue_.empty()) {
    if (!next_ready) e = queue_.Pop();
    next_ready = false;
    clock_.Set(Time::UnixEpoch() + scenario_.clock_start + Duration::Micros(e.time_us));
    switch (e.kind) {
      case Kind::kArrival: {
        Source& source = sources_[e.client];
        if (e.time_us >= duration_us_) break;  // a burst reaching past the end
        const int64_t clients = scenario_.groups[source.group].clients;
        const bool spread_evenly = source.arrival->kind == ArrivalKind::kBurst ||
                                   source.arrival->kind == ArrivalKind::kConstant;
        uint32_t client = 0;
        if (spread_evenly) {
          client = static_cast<uint32_t>(source.round_robin);
          if (++source.round_robin == clients) source.round_robin = 0;
        } else {
          client = static_cast<uint32_t>(source.rng.Below(static_cast<uint64_t>(clients)));
        }
        ++run_.requests;
        Attempt({.time_us = e.time_us,
                 .first_us = e.time_us,
                 .client = client,
                 .key = KeyOf(source.group, client),
                 .attempt = 1,
                 .group = static_cast<uint16_t>(source.group),
                 .kind = Kind::kRetry});
        const int64_t next = NextArrival(source);
        if (next < 0) break;
        const Event arrival =
            Numbered({.time_us = next, .client = e.client, .kind = Kind::kArrival});
        if (queue_.Before(arrival)) {
          e = arrival;
          next_ready = true;
        } else {
          queue_.Push(arrival);
        }
        break;
      }
      case Kind::kRetry:
        Attempt(e);
        break;
      case Kind::kRelease:
        Release(e.time_us, e);
        break;
      case Kind::kDone:
        Done(e);
        break;
    }
    if (run_.offered > scenario_.max_attempts) {
      return absl::ResourceExhaustedError(
          Cat("scenario ", scenario_.name, ", limiter ", setup_.name, ": more than ",
              scenario_.max_attempts, " requests and retries; shorten it or lower its rates"));
    }
  }
  if (!gate_->status.ok()) return gate_->status;
  return Finish();
}

void Engine::Attempt(const Event& e) {
  const int64_t t = e.time_us;
  const auto second = static_cast<size_t>(t / 1'000'000);
  ++run_.offered;
  ++offered_s_[second];
  if (e.attempt > 1) {
    ++run_.retries;
    ++retries_s_[second];
    if (first_retry_us_ < 0) first_retry_us_ = t;
    last_retry_us_ = t;
  }
  size_t instance = 0;
  if (scenario_.instances > 1) {
    instance = scenario_.balance == Balance::kSticky
                   ? (client_base_[e.group] + e.client) % static_cast<size_t>(scenario_.instances)
                   : static_cast<size_t>(round_robin_++ % scenario_.instances);
  }
  const size_t state = states_ == 1 ? 0 : instance;
  Answer answer = gate_->Decide(state, e.key, clock_.Now());
  const Decision& d = answer.decision;
  if (d.allowed) {
    ++run_.admitted;
    delay_.Add(d.delay);
    Event admitted = e;
    admitted.taken_us = t;
    admitted.state = static_cast<uint32_t>(state);
    if (d.delay > Duration::Zero()) {
      ++run_.delayed;
      admitted.time_us = t + d.delay.micros();
      admitted.kind = Kind::kRelease;
      Push(admitted);
    } else {
      Release(t, admitted);
    }
    return;
  }
  const size_t deciding = std::min(answer.limit_index, setup_.limits.size() - 1);
  if (setup_.limits[deciding].algorithm == Algorithm::kConcurrency && !d.can_never_pass()) {
    answer.decision.retry_after = holds_.Cap(d.retry_after);  // as `sluice serve` answers
  }
  ++run_.rejected;
  ++rejected_s_[second];
  const RetryPolicy& policy = setup_.retry ? *setup_.retry : scenario_.groups[e.group].retry;
  const int64_t wait = RetryWait(policy, e.attempt, answer);
  if (wait < 0) {
    ++run_.gave_up;
  } else if (t + wait >= duration_us_) {
    ++run_.unfinished;  // would come back after the end
  } else {
    Event retry = e;
    retry.time_us = t + wait;
    retry.attempt = e.attempt + 1;
    Push(retry);
  }
}

int64_t Engine::RetryWait(const RetryPolicy& policy, uint32_t attempt, const Answer& answer) {
  if (policy.kind == RetryKind::kNever) return -1;
  if (policy.max_attempts > 0 && attempt >= policy.max_attempts) return -1;
  int64_t wait = 0;
  switch (policy.kind) {
    case RetryKind::kNever:
      return -1;
    case RetryKind::kFixed:
      wait = policy.delay.micros() + client_rng_.UpTo(policy.jitter.micros());
      break;
    case RetryKind::kRetryAfter: {
      const Decision& d = answer.decision;
      if (d.can_never_pass()) return -1;  // no Retry-After is sent: nothing to wait for
      // What `sluice serve` sends: whole seconds, never earlier than the
      // exact wait, plus uniform jitter (server/headers.h RetryAfterSeconds).
      Duration jitter;
      const LimitOptions& limit =
          setup_.limits[std::min(answer.limit_index, setup_.limits.size() - 1)];
      if (setup_.retry_after_jitter) {
        jitter = *setup_.retry_after_jitter;
      } else if (limit.algorithm == Algorithm::kConcurrency && holds_.value() > Duration::Zero()) {
        jitter = DefaultRetryAfterJitter(holds_.value());
      } else {
        const Duration period =
            limit.algorithm == Algorithm::kConcurrency
                ? (limit.lease_ttl > Duration::Zero() ? limit.lease_ttl : kDefaultLeaseTtl)
                : limit.rate.period;
        jitter = DefaultRetryAfterJitter(period);
      }
      const int64_t seconds =
          (d.retry_after + Duration::Micros(server_rng_.UpTo(jitter.micros()))).CeilSeconds();
      wait = seconds * 1'000'000 + client_rng_.UpTo(policy.jitter.micros());
      break;
    }
    case RetryKind::kBackoff: {
      const int shift = static_cast<int>(std::min<uint32_t>(attempt - 1, 40));
      const int64_t ceiling =
          std::min(policy.cap.micros(), policy.base.micros() > (policy.cap.micros() >> shift)
                                            ? policy.cap.micros()
                                            : policy.base.micros() << shift);
      wait = client_rng_.UpTo(ceiling);
      break;
    }
  }
  return std::max<int64_t>(wait, 1);  // a retry is never at the same instant
}

int64_t Engine::ServiceMicros() {
  const ServiceTime& s = *scenario_.service_time;
  switch (s.kind) {
    case ServiceTime::Kind::kConstant:
      return s.a.micros();
    case ServiceTime::Kind::kExponential:
      return std::max<int64_t>(
          1, std::llround(service_rng_.Exponential(static_cast<double>(s.a.micros()))));
    case ServiceTime::Kind::kUniform:
      return s.a.micros() + service_rng_.UpTo(s.b.micros() - s.a.micros());
  }
  return 0;
}

void Engine::Done(const Event& e) {
  --in_flight_[e.key];
  if (!gate_->holds()) return;
  const Time taken = Time::UnixEpoch() + scenario_.clock_start + Duration::Micros(e.taken_us);
  gate_->Done(e.state, e.key, taken);
  holds_.Observe(Duration::Micros(e.time_us - e.taken_us));
}

void Engine::Release(int64_t t_us, const Event& admitted) {
  const int64_t first_us = admitted.first_us;
  const uint32_t key = admitted.key;
  if (const auto second = static_cast<size_t>(t_us / 1'000'000); second < admitted_s_.size()) {
    ++admitted_s_[second];
  }
  per_second_.Add(t_us);
  per_key_period_[key].Add(t_us);
  int64_t done_us = t_us;
  if (scenario_.downstream) {
    const Rate& capacity = scenario_.downstream->capacity;
    const int64_t now_scaled = t_us * capacity.limit;
    const int64_t service = capacity.period.micros();
    const int64_t backlog_scaled = std::max<int64_t>(0, next_free_scaled_ - now_scaled);
    const int64_t in_system = (backlog_scaled + service - 1) / service;
    if (scenario_.downstream->queue > 0 && in_system > scenario_.downstream->queue) {
      ++run_.dropped;  // one in service, `queue` waiting: no room
      if (gate_->holds()) {
        gate_->Done(
            admitted.state, key,
            Time::UnixEpoch() + scenario_.clock_start + Duration::Micros(admitted.taken_us));
      }
      return;
    }
    const int64_t start_scaled = std::max(next_free_scaled_, now_scaled);
    next_free_scaled_ = start_scaled + service;
    run_.peak_backlog = std::max(run_.peak_backlog, in_system + 1);
    const int64_t wait_us = (start_scaled - now_scaled + capacity.limit - 1) / capacity.limit;
    run_.max_queue_wait = std::max(run_.max_queue_wait, Duration::Micros(wait_us));
    done_us = (next_free_scaled_ + capacity.limit - 1) / capacity.limit;
  } else if (scenario_.service_time) {
    done_us = t_us + ServiceMicros();
  }
  if (done_us > t_us || gate_->holds()) {
    // In flight until done (a slot, when the gate holds one, until then).
    run_.peak_in_flight = std::max(run_.peak_in_flight, ++in_flight_[key]);
    Event done = admitted;
    done.time_us = done_us;
    done.kind = Kind::kDone;
    Push(done);
  }
  ++run_.served;
  latency_.Add(Duration::Micros(done_us - first_us));
  last_completion_us_ = std::max(last_completion_us_, done_us);
}

Percentiles PercentilesOf(const Histogram& h) {
  return {h.Percentile(0.5), h.Percentile(0.9), h.Percentile(0.99), h.max()};
}

// Sums per-second counts into buckets of `factor` seconds.
std::vector<int64_t> Rebucket(const std::vector<int64_t>& per_second, size_t factor) {
  std::vector<int64_t> out((per_second.size() + factor - 1) / factor, 0);
  for (size_t i = 0; i < per_second.size(); ++i) out[i / factor] += per_second[i];
  return out;
}

LimiterRun Engine::Finish() {
  LimiterRun& r = run_;
  r.max_admitted_1s = per_second_.max();
  for (const RollingMax& m : per_key_period_)
    r.max_admitted_period = std::max(r.max_admitted_period, m.max());
  // Evenness over the span that saw admissions.
  size_t first = admitted_s_.size(), last = 0;
  for (size_t i = 0; i < admitted_s_.size(); ++i) {
    if (admitted_s_[i] == 0) continue;
    first = std::min(first, i);
    last = i;
  }
  if (first <= last && first < admitted_s_.size()) {
    const double n = static_cast<double>(last - first + 1);
    double sum = 0, sum_sq = 0;
    for (size_t i = first; i <= last; ++i) {
      const auto x = static_cast<double>(admitted_s_[i]);
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / n;
    const double variance = std::max(0.0, sum_sq / n - mean * mean);
    r.admitted_cv = mean > 0 ? std::sqrt(variance) / mean : 0;
  }
  r.delay = PercentilesOf(delay_);
  r.latency = PercentilesOf(latency_);
  if (last_completion_us_ >= 0) r.served_by = Duration::Micros(last_completion_us_);
  for (size_t i = 0; i < offered_s_.size(); ++i) {
    r.peak_arrivals_1s = std::max(r.peak_arrivals_1s, offered_s_[i]);
    r.peak_retries_1s = std::max(r.peak_retries_1s, retries_s_[i]);
  }
  if (first_retry_us_ >= 0) r.retry_wave = Duration::Micros(last_retry_us_ - first_retry_us_);

  // Plots and tools get at most ~1200 buckets: 1 s up to 20 minutes.
  size_t factor = 1;
  while (offered_s_.size() / factor > 1200) {
    static constexpr size_t kSteps[] = {1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600};
    size_t next = factor;
    for (size_t step : kSteps) {
      if (step > factor) {
        next = step;
        break;
      }
    }
    factor = next == factor ? factor * 2 : next;
  }
  r.series.bucket = Duration::Seconds(static_cast<int64_t>(factor));
  r.series.offered = Rebucket(offered_s_, factor);
  r.series.admitted = Rebucket(admitted_s_, factor);
  r.series.rejected = Rebucket(rejected_s_, factor);
  r.series.retries = Rebucket(retries_s_, factor);
  return std::move(run_);
}

absl::Status Validate(const Scenario& s) {
  auto fail = [&](std::string_view what) {
    return absl::InvalidArgumentError(Cat("scenario ", s.name, ": ", what));
  };
  if (s.duration <= Duration::Zero() || s.duration > kMaxDuration) {
    return fail(Cat("duration must be from 1us to ", FormatDuration(kMaxDuration)));
  }
  if (s.instances < 1 || s.instances > kMaxInstances) {
    return fail(Cat("instances must be from 1 to ", kMaxInstances));
  }
  if (s.limiters.empty()) return fail("no limiters to compare");
  if (s.groups.size() > 65535) return fail("more than 65535 client groups");
  int64_t clients = 0;
  for (const ClientGroup& g : s.groups) {
    if (g.clients < 1) return fail(Cat("group ", g.name, ": clients must be at least 1"));
    clients += g.clients;
    if (clients > kMaxClients) return fail(Cat("more than ", kMaxClients, " clients"));
    for (const Arrival& a : g.traffic) {
      if (a.kind == ArrivalKind::kBurst && (a.count < 0 || a.spread < Duration::Zero())) {
        return fail(Cat("group ", g.name, ": a burst needs count >= 0 and spread >= 0"));
      }
      if (a.kind != ArrivalKind::kBurst) {
        if (!ValidateRate(a.rate).ok()) return fail(Cat("group ", g.name, ": invalid rate"));
        if (a.kind == ArrivalKind::kDiurnal &&
            (!ValidateRate(a.low).ok() || a.cycle <= Duration::Zero())) {
          return fail(Cat("group ", g.name, ": diurnal needs a low rate and a positive cycle"));
        }
      }
    }
  }
  if (s.downstream) {
    if (!ValidateRate(s.downstream->capacity).ok() || s.downstream->capacity.limit > 1'000'000) {
      return fail("downstream capacity must be a rate of at most 1000000 per period");
    }
  }
  if (s.contract && !ValidateRate(*s.contract).ok()) return fail("invalid contract rate");
  if (s.service_time) {
    const ServiceTime& t = *s.service_time;
    if (s.downstream) return fail("a downstream or a service time, not both");
    if (t.a <= Duration::Zero() || t.a > kMaxServiceTime ||
        (t.kind == ServiceTime::Kind::kUniform && (t.b < t.a || t.b > kMaxServiceTime))) {
      return fail("service times are positive and at most 1h");
    }
  }
  for (const LimiterSetup& l : s.limiters) {
    if (l.limits.empty()) return fail(Cat("limiter ", l.name, ": no limits"));
    for (const LimitOptions& limit : l.limits) {
      if (limit.algorithm == Algorithm::kConcurrency && !s.downstream && !s.service_time) {
        return fail(
            Cat("limiter ", l.name, ": a concurrency limit needs a downstream or a service time"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LimiterRun> SimulateRun(const Scenario& scenario, size_t limiter, uint64_t seed) {
  if (absl::Status s = Validate(scenario); !s.ok()) return s;
  if (limiter >= scenario.limiters.size()) {
    return absl::InvalidArgumentError(Cat("scenario ", scenario.name, " has no limiter ", limiter));
  }
  auto engine = std::make_unique<Engine>(scenario, scenario.limiters[limiter], seed);
  return engine->Execute();
}

absl::StatusOr<Result> Simulate(const Scenario& scenario, uint64_t seed) {
  if (absl::Status s = Validate(scenario); !s.ok()) return s;
  Result result{.scenario = scenario.name,
                .description = scenario.description,
                .seed = seed,
                .duration = scenario.duration,
                .instances = scenario.instances,
                .downstream = scenario.downstream,
                .service_time = scenario.service_time};
  for (size_t i = 0; i < scenario.limiters.size(); ++i) {
    absl::StatusOr<LimiterRun> run = SimulateRun(scenario, i, seed);
    if (!run.ok()) return run.status();
    result.runs.push_back(*std::move(run));
  }
  return result;
}

}  // namespace sluice::sim
