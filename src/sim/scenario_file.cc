// The scenario file reader: yaml-cpp builds the node tree, this file walks it
// against the schema in docs/simulator.md, with the reader every sluice file
// format shares (config/yaml_reader.h): errors read like the config
// loader's, "<source>:<line>: <path>: <message>", the first one found,
// unknown and duplicate keys included, and a limit takes the keys of a
// config's limit.
#include "sim/scenario_file.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/cat.h"
#include "config/yaml_reader.h"
#include "config/yaml_text.h"
#include "sim/engine.h"
#include "sluice/algorithm.h"

namespace sluice::sim {
namespace {

using internal::Cat;
using internal::DescribeNode;
using internal::kPositive;
using internal::NameChars;
using Value = internal::YamlAt;

class Reader : public internal::YamlReader {
 public:
  explicit Reader(std::string source) : YamlReader(std::move(source)) {}

  absl::StatusOr<Scenario> Run(std::string_view yaml, const std::string& default_name);

 private:
  absl::Status ReadRetry(const Value& v, RetryPolicy& out) const;
  absl::Status ReadArrival(const Value& v, Duration duration, Arrival& out) const;
  absl::Status ReadGroup(const Value& v, Duration duration, ClientGroup& out) const;
  absl::StatusOr<LimitOptions> ReadLimit(const Value& v, const Fields& f) const;
  absl::Status ReadLimiter(const Value& v, LimiterSetup& out);
  absl::Status ReadServiceTime(const Value& v, ServiceTime& out) const;

  std::vector<std::string> warnings_;  // for Scenario::warnings
  bool serves_ = false;                // a downstream or a service time: requests take time
};

// service_time: 200ms (constant), {exponential: 200ms} (the mean) or
// {uniform: [100ms, 300ms]}.
absl::Status Reader::ReadServiceTime(const Value& v, ServiceTime& out) const {
  const internal::DurationBounds bounds{.min = Duration::Micros(1), .max = kMaxServiceTime};
  if (v.node.IsScalar()) {
    out.kind = ServiceTime::Kind::kConstant;
    SLUICE_ASSIGN_OR_RETURN(out.a, ReadDuration(v, bounds));
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f = ReadMap(v, "a duration, {exponential: MEAN} or {uniform: [LOW, HIGH]}",
                                     {"constant", "exponential", "uniform"});
  if (!f.ok()) return f.status();
  const int given = (f->Find("constant") != nullptr) + (f->Find("exponential") != nullptr) +
                    (f->Find("uniform") != nullptr);
  if (given != 1) return Fail(v, "one of constant, exponential or uniform");
  if (const Value* x = f->Find("constant")) {
    out.kind = ServiceTime::Kind::kConstant;
    SLUICE_ASSIGN_OR_RETURN(out.a, ReadDuration(*x, bounds));
  } else if (const Value* x = f->Find("exponential")) {
    out.kind = ServiceTime::Kind::kExponential;
    SLUICE_ASSIGN_OR_RETURN(out.a, ReadDuration(*x, bounds));
  } else {
    const Value* u = f->Find("uniform");
    absl::StatusOr<std::vector<Value>> ends = ReadList(*u, "[LOW, HIGH]");
    if (!ends.ok()) return ends.status();
    if (ends->size() != 2) return Fail(*u, "two durations: [LOW, HIGH]");
    out.kind = ServiceTime::Kind::kUniform;
    SLUICE_ASSIGN_OR_RETURN(out.a, ReadDuration((*ends)[0], bounds));
    SLUICE_ASSIGN_OR_RETURN(out.b, ReadDuration((*ends)[1], bounds));
    if (out.b < out.a) return Fail(*u, "HIGH must not be below LOW");
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadRetry(const Value& v, RetryPolicy& out) const {
  static constexpr internal::Choice<RetryKind> kPolicies[] = {
      {"never", RetryKind::kNever},
      {"fixed", RetryKind::kFixed},
      {"retry_after", RetryKind::kRetryAfter},
      {"backoff", RetryKind::kBackoff},
  };
  if (v.node.IsScalar()) {  // the short form: `retry: retry_after`
    SLUICE_ASSIGN_OR_RETURN(const RetryKind kind, ReadChoice(v, kPolicies));
    if (kind == RetryKind::kFixed)
      return Fail(v, "fixed needs a delay: {policy: fixed, delay: 5s}");
    out = RetryPolicy{.kind = kind};
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys, {"policy", "delay", "jitter", "base", "cap", "max_attempts"});
  if (!f.ok()) return f.status();
  const Value* policy = f->Find("policy");
  if (policy == nullptr) {
    return Fail(f->Missing("policy"), "required (never, fixed, retry_after, backoff)");
  }
  SLUICE_ASSIGN_OR_RETURN(const RetryKind kind, ReadChoice(*policy, kPolicies));
  out = RetryPolicy{.kind = kind};
  auto only_for = [&](std::string_view key,
                      std::initializer_list<RetryKind> kinds) -> absl::Status {
    const Value* x = f->Find(key);
    if (x == nullptr || std::find(kinds.begin(), kinds.end(), out.kind) != kinds.end()) {
      return absl::OkStatus();
    }
    return Fail(*x, Cat("does not apply to policy ", policy->node.Scalar()));
  };
  SLUICE_RETURN_IF_ERROR(only_for("delay", {RetryKind::kFixed}));
  SLUICE_RETURN_IF_ERROR(only_for("jitter", {RetryKind::kFixed, RetryKind::kRetryAfter}));
  SLUICE_RETURN_IF_ERROR(only_for("base", {RetryKind::kBackoff}));
  SLUICE_RETURN_IF_ERROR(only_for("cap", {RetryKind::kBackoff}));
  SLUICE_RETURN_IF_ERROR(
      only_for("max_attempts", {RetryKind::kFixed, RetryKind::kRetryAfter, RetryKind::kBackoff}));
  if (out.kind == RetryKind::kFixed) {
    const Value* delay = f->Find("delay");
    if (delay == nullptr) return Fail(f->Missing("delay"), "required for policy fixed");
    SLUICE_ASSIGN_OR_RETURN(out.delay, ReadDuration(*delay, {.min = kPositive}));
  }
  if (const Value* x = f->Find("jitter")) {
    SLUICE_ASSIGN_OR_RETURN(out.jitter, ReadDuration(*x));
  }
  if (const Value* x = f->Find("base")) {
    SLUICE_ASSIGN_OR_RETURN(out.base, ReadDuration(*x, {.min = kPositive}));
  }
  if (const Value* x = f->Find("cap")) {
    SLUICE_ASSIGN_OR_RETURN(out.cap, ReadDuration(*x, {.min = kPositive}));
  }
  if (out.cap < out.base) return Fail(*f->Find("cap"), "must be at least base");
  if (const Value* x = f->Find("max_attempts")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_attempts, ReadInt(*x, 1, 1'000'000));
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadArrival(const Value& v, Duration duration, Arrival& out) const {
  absl::StatusOr<Fields> f = ReadMap(
      v, kMapOfKeys, {"burst", "constant", "poisson", "diurnal", "at", "spread", "from", "until"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap()) return Fail(v, "expected a map such as {poisson: 10/s}");
  static constexpr std::string_view kKinds[] = {"burst", "constant", "poisson", "diurnal"};
  const Value* kind = nullptr;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    const Value* x = f->Find(kKinds[i]);
    if (x == nullptr) continue;
    if (kind != nullptr)
      return Fail(*x, Cat("one pattern per entry; this one already has ",
                          kind->path.substr(kind->path.rfind('.') + 1)));
    kind = x;
    out.kind = static_cast<ArrivalKind>(i);
  }
  if (kind == nullptr) return Fail(v, "needs one of: burst, constant, poisson, diurnal");
  const bool burst = out.kind == ArrivalKind::kBurst;
  for (std::string_view key : {"at", "spread"}) {
    if (const Value* x = f->Find(key); x != nullptr && !burst)
      return Fail(*x, "applies only to burst (use from/until)");
  }
  for (std::string_view key : {"from", "until"}) {
    if (const Value* x = f->Find(key); x != nullptr && burst)
      return Fail(*x, "does not apply to burst (use at/spread)");
  }
  if (burst) {
    SLUICE_ASSIGN_OR_RETURN(out.count, ReadInt(*kind, 0, kMaxAttempts));
    if (const Value* x = f->Find("at")) {
      SLUICE_ASSIGN_OR_RETURN(out.from, ReadDuration(*x));
    }
    if (const Value* x = f->Find("spread")) {
      SLUICE_ASSIGN_OR_RETURN(out.spread, ReadDuration(*x));
    }
    if (out.from >= duration)
      return Fail(f->Find("at") ? *f->Find("at") : *kind, "is at or after the scenario's end");
    return absl::OkStatus();
  }
  if (out.kind == ArrivalKind::kDiurnal) {
    absl::StatusOr<Fields> d = ReadMap(*kind, kMapOfKeys, {"low", "high", "peak_at", "cycle"});
    if (!d.ok()) return d.status();
    if (!kind->node.IsMap())
      return Fail(*kind, "expected {low: RATE, high: RATE, peak_at: DURATION}");
    for (std::string_view key : {"low", "high"}) {
      const Value* x = d->Find(key);
      if (x == nullptr) return Fail(d->Missing(key), "required");
      Rate& rate = key == "low" ? out.low : out.rate;
      SLUICE_ASSIGN_OR_RETURN(rate, ReadRate(*x));
    }
    if (const Value* x = d->Find("peak_at")) {
      SLUICE_ASSIGN_OR_RETURN(out.peak_at, ReadDuration(*x));
    }
    if (const Value* x = d->Find("cycle")) {
      SLUICE_ASSIGN_OR_RETURN(out.cycle, ReadDuration(*x, {.min = Duration::Seconds(1)}));
    }
    // Compare per microsecond without rounding: low.limit/low.period vs rate.limit/rate.period.
    if (static_cast<__int128>(out.low.limit) * out.rate.period.micros() >
        static_cast<__int128>(out.rate.limit) * out.low.period.micros()) {
      return Fail(*d->Find("low"), "must not be above high");
    }
  } else {
    SLUICE_ASSIGN_OR_RETURN(out.rate, ReadRate(*kind));
  }
  out.until = duration;
  if (const Value* x = f->Find("from")) {
    SLUICE_ASSIGN_OR_RETURN(out.from, ReadDuration(*x));
  }
  if (const Value* x = f->Find("until")) {
    SLUICE_ASSIGN_OR_RETURN(out.until, ReadDuration(*x, {.min = kPositive}));
  }
  if (out.until <= out.from)
    return Fail(f->Find("until") ? *f->Find("until") : *f->Find("from"),
                "must end after it starts");
  return absl::OkStatus();
}

absl::Status Reader::ReadGroup(const Value& v, Duration duration, ClientGroup& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys, {"name", "count", "key", "retry", "traffic"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap()) return Fail(v, "expected a client group (a map with name and traffic)");
  if (const Value* x = f->Find("name")) {
    SLUICE_ASSIGN_OR_RETURN(out.name, ReadName(*x, NameChars::kLabel));
  }
  if (const Value* x = f->Find("count")) {
    SLUICE_ASSIGN_OR_RETURN(out.clients, ReadInt(*x, 1, kMaxClients));
  }
  if (const Value* x = f->Find("key")) {
    SLUICE_ASSIGN_OR_RETURN(out.key, ReadChoice<KeyMode>(*x, {{"client", KeyMode::kClient},
                                                              {"group", KeyMode::kGroup},
                                                              {"global", KeyMode::kGlobal}}));
  }
  if (const Value* x = f->Find("retry")) SLUICE_RETURN_IF_ERROR(ReadRetry(*x, out.retry));
  const Value* traffic = f->Find("traffic");
  if (traffic == nullptr)
    return Fail(f->Missing("traffic"), "required (a list such as [{poisson: 10/s}])");
  absl::StatusOr<std::vector<Value>> items = ReadList(*traffic, "arrival patterns");
  if (!items.ok()) return items.status();
  if (items->empty()) return Fail(*traffic, "needs at least one arrival pattern");
  for (const Value& item : *items) {
    Arrival a;
    SLUICE_RETURN_IF_ERROR(ReadArrival(item, duration, a));
    out.traffic.push_back(a);
  }
  return absl::OkStatus();
}

// The keys of one limit, as in a policy of the config file
// (docs/configuration.md), read from `f`, and validated at `v`.
absl::StatusOr<LimitOptions> Reader::ReadLimit(const Value& v, const Fields& f) const {
  SLUICE_ASSIGN_OR_RETURN(LimitOptions out, ReadLimitOptions(f));
  if (out.algorithm == Algorithm::kConcurrency && !serves_) {
    // Nothing would give a slot back: every request completes at once.
    return Fail(v,
                "a concurrency limit needs requests that take time: set the scenario's "
                "service_time or downstream");
  }
  if (absl::StatusOr<LimitConfig> config = MakeLimit(out); !config.ok())
    return Fail(v, config.status());
  return out;
}

absl::Status Reader::ReadLimiter(const Value& v, LimiterSetup& out) {
  const std::initializer_list<std::string_view> kLimitKeys = {
      "algorithm", "rate", "limit", "period", "burst", "mode", "max_delay", "queue", "lease_ttl"};
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys,
              {"name", "scope", "retry_after_jitter", "retry", "limits", "algorithm", "rate",
               "limit", "period", "burst", "mode", "max_delay", "queue", "lease_ttl"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap())
    return Fail(v, "expected a limiter (a map with algorithm and rate, or limits)");
  if (const Value* x = f->Find("name")) {
    SLUICE_ASSIGN_OR_RETURN(out.name, ReadName(*x, NameChars::kLabel));
  }
  if (const Value* x = f->Find("scope")) {
    // `shared` was this file's word for what the serve config calls global;
    // it still reads, with a warning.
    if (x->node.IsScalar() && x->node.Scalar() == "shared") {
      warnings_.push_back(Locate(*x,
                                 "\"shared\" is deprecated: write global (the same meaning, "
                                 "as in the serve config)"));
      out.scope = StateScope::kShared;
    } else {
      SLUICE_ASSIGN_OR_RETURN(
          out.scope, ReadChoice<StateScope>(
                         *x, {{"local", StateScope::kLocal}, {"global", StateScope::kShared}}));
    }
  }
  if (const Value* x = f->Find("retry_after_jitter")) {
    SLUICE_ASSIGN_OR_RETURN(out.retry_after_jitter, ReadDuration(*x));
  }
  if (const Value* x = f->Find("retry")) {
    RetryPolicy retry;
    SLUICE_RETURN_IF_ERROR(ReadRetry(*x, retry));
    out.retry = retry;
  }
  if (const Value* limits = f->Find("limits")) {
    for (std::string_view key : kLimitKeys) {
      if (const Value* x = f->Find(key))
        return Fail(*x, "set the limit inline or under limits, not both");
    }
    absl::StatusOr<std::vector<Value>> items = ReadList(*limits, "limits");
    if (!items.ok()) return items.status();
    if (items->empty()) return Fail(*limits, "needs at least one limit");
    std::optional<size_t> shape;
    for (size_t i = 0; i < items->size(); ++i) {
      const Value& item = (*items)[i];
      absl::StatusOr<Fields> lf = ReadMap(item, kMapOfKeys, kLimitKeys);
      if (!lf.ok()) return lf.status();
      if (!item.node.IsMap()) return Fail(item, "expected a limit (a map with algorithm and rate)");
      SLUICE_ASSIGN_OR_RETURN(const LimitOptions limit, ReadLimit(item, *lf));
      const bool is_shape =
          limit.algorithm == Algorithm::kLeakyBucket && limit.mode == LeakyMode::kShape;
      if (is_shape && shape) {
        return Fail(item, Cat("at most one leaky_bucket shape limit per limiter (limits[", *shape,
                              "] is one already)"));
      }
      if (is_shape) shape = i;
      out.limits.push_back(limit);
    }
  } else {
    SLUICE_ASSIGN_OR_RETURN(const LimitOptions limit, ReadLimit(v, *f));
    out.limits.push_back(limit);
  }
  if (out.name.empty()) {
    for (const LimitOptions& l : out.limits)
      out.name += Cat(out.name.empty() ? "" : " + ", DescribeLimit(l));
  }
  return absl::OkStatus();
}

absl::StatusOr<Scenario> Reader::Run(std::string_view yaml, const std::string& default_name) {
  absl::StatusOr<std::optional<Value>> document = ReadDocument(yaml, "a scenario file");
  if (!document.ok()) return document.status();
  const Value top = document->value_or(Value{YAML::Node(), "", 1});
  if (!top.node.IsMap()) {
    return Fail(top, Cat("expected a scenario (a map with duration, clients and limiters), got ",
                         DescribeNode(top.node)));
  }
  absl::StatusOr<Fields> f =
      ReadMap(top, kMapOfKeys,
              {"name", "description", "duration", "clock_start", "seed", "instances", "balance",
               "downstream", "service_time", "contract", "clients", "limiters"});
  if (!f.ok()) return f.status();
  Scenario s;
  s.name = default_name;
  if (const Value* x = f->Find("name")) {
    SLUICE_ASSIGN_OR_RETURN(s.name, ReadName(*x, NameChars::kLabel));
  }
  if (const Value* x = f->Find("description")) {
    SLUICE_ASSIGN_OR_RETURN(s.description, ReadScalar(*x, "text"));
  }
  const Value* duration = f->Find("duration");
  if (duration == nullptr)
    return Fail(f->Missing("duration"), "required (how long to simulate, e.g. 10m)");
  SLUICE_ASSIGN_OR_RETURN(
      s.duration, ReadDuration(*duration, {.min = Duration::Seconds(1), .max = kMaxDuration}));
  if (const Value* x = f->Find("clock_start")) {
    SLUICE_ASSIGN_OR_RETURN(s.clock_start, ReadDuration(*x));
  }
  if (const Value* x = f->Find("seed")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t seed,
                            ReadInt(*x, 0, std::numeric_limits<int64_t>::max()));
    s.seed = static_cast<uint64_t>(seed);
  }
  if (const Value* x = f->Find("instances")) {
    SLUICE_ASSIGN_OR_RETURN(s.instances, ReadInt(*x, 1, kMaxInstances));
  }
  if (const Value* x = f->Find("balance")) {
    SLUICE_ASSIGN_OR_RETURN(
        s.balance, ReadChoice<Balance>(
                       *x, {{"round_robin", Balance::kRoundRobin}, {"sticky", Balance::kSticky}}));
  }
  if (const Value* x = f->Find("downstream")) {
    absl::StatusOr<Fields> d = ReadMap(*x, kMapOfKeys, {"capacity", "queue"});
    if (!d.ok()) return d.status();
    const Value* capacity = d->Find("capacity");
    if (capacity == nullptr) return Fail(d->Missing("capacity"), "required (a rate such as 40/s)");
    Downstream down;
    SLUICE_ASSIGN_OR_RETURN(down.capacity, ReadRate(*capacity));
    if (down.capacity.limit > 1'000'000) return Fail(*capacity, "at most 1000000 per period");
    if (const Value* q = d->Find("queue")) {
      SLUICE_ASSIGN_OR_RETURN(down.queue, ReadInt(*q, 0, kMaxAttempts));
    }
    s.downstream = down;
  }
  if (const Value* x = f->Find("service_time")) {
    if (s.downstream) {
      return Fail(*x, "give downstream (a server of a capacity) or service_time, not both");
    }
    SLUICE_RETURN_IF_ERROR(ReadServiceTime(*x, s.service_time.emplace()));
  }
  if (const Value* x = f->Find("contract")) {
    SLUICE_ASSIGN_OR_RETURN(s.contract, ReadRate(*x));
  }
  serves_ = s.downstream.has_value() || s.service_time.has_value();

  const Value* clients = f->Find("clients");
  if (clients == nullptr) return Fail(f->Missing("clients"), "required (a list of client groups)");
  absl::StatusOr<std::vector<Value>> groups = ReadList(*clients, "client groups");
  if (!groups.ok()) return groups.status();
  if (groups->empty()) return Fail(*clients, "needs at least one client group");
  std::set<std::string> group_names;
  int64_t total_clients = 0;
  for (size_t i = 0; i < groups->size(); ++i) {
    ClientGroup g{.name = Cat("clients", i)};
    SLUICE_RETURN_IF_ERROR(ReadGroup((*groups)[i], s.duration, g));
    if (!group_names.insert(g.name).second)
      return Fail((*groups)[i], Cat("a second group named ", g.name));
    total_clients += g.clients;
    if (total_clients > kMaxClients)
      return Fail((*groups)[i], Cat("more than ", kMaxClients, " clients in all"));
    s.groups.push_back(std::move(g));
  }

  const Value* limiters = f->Find("limiters");
  if (limiters == nullptr) return Fail(f->Missing("limiters"), "required (the limits to compare)");
  absl::StatusOr<std::vector<Value>> items = ReadList(*limiters, "limiters");
  if (!items.ok()) return items.status();
  if (items->empty()) return Fail(*limiters, "needs at least one limiter");
  std::set<std::string> names;
  for (const Value& item : *items) {
    LimiterSetup l;
    SLUICE_RETURN_IF_ERROR(ReadLimiter(item, l));
    if (!names.insert(l.name).second) {
      return Fail(item, Cat("a second limiter named \"", l.name, "\" (give it a name:)"));
    }
    s.limiters.push_back(std::move(l));
  }
  s.warnings = std::move(warnings_);
  return s;
}

}  // namespace

absl::StatusOr<Scenario> ParseScenario(std::string_view yaml, const std::string& source,
                                       const std::string& default_name) {
  try {
    return Reader(source).Run(yaml, default_name);
  } catch (const YAML::Exception& e) {
    // The walk checks every node's type before reading it; this is a guard.
    return absl::InvalidArgumentError(Cat(source, ": cannot read the YAML: ", e.what()));
  }
}

absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path) {
  absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
  if (!text.ok()) return text.status();
  std::string stem = path.substr(path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find('.'));
  return ParseScenario(*text, path, stem.empty() ? "scenario" : stem);
}

}  // namespace sluice::sim
