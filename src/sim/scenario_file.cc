// The scenario file reader: yaml-cpp builds the node tree, this file walks it
// against the schema in docs/simulator.md.
//
// Errors read like the config loader's (src/config/config.cc):
// "<source>:<line>: <path>: <message>", the first one found, unknown and
// duplicate keys included. The small node readers below follow that file's;
// they are not shared with it because config.cc keeps its readers private.
#include "sim/scenario_file.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <limits>
#include <set>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/cat.h"
#include "config/yaml_text.h"
#include "sim/engine.h"
#include "sluice/algorithm.h"

#define SLUICE_SIM_RETURN_IF_ERROR(expr)                              \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (0)

namespace sluice::sim {
namespace {

using internal::Cat;
using Value = internal::YamlAt;
using internal::DescribeNode;
using internal::JoinPath;
using internal::LineOf;

std::string ListOf(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view name : names) out += Cat(out.empty() ? "" : ", ", name);
  return out;
}

// The entries of one map, checked against the keys allowed there.
class Fields {
 public:
  const Value* Find(std::string_view key) const {
    for (const Entry& e : entries_) {
      if (e.name == key) return &e.value;
    }
    return nullptr;
  }
  Value Missing(std::string_view key) const { return {YAML::Node(), JoinPath(self_.path, key), self_.line}; }
  const Value& self() const { return self_; }

 private:
  friend class Reader;
  struct Entry {
    std::string name;
    Value value;
  };
  Value self_;
  std::vector<Entry> entries_;
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  absl::Status Fail(const Value& at, std::string_view message) const {
    if (at.path.empty()) return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", message));
    return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", at.path, ": ", message));
  }
  absl::Status Fail(const Value& at, const absl::Status& status) const {
    return Fail(at, std::string_view(status.message().data(), status.message().size()));
  }

  absl::StatusOr<Fields> Map(const Value& v, std::initializer_list<std::string_view> allowed) const {
    Fields fields;
    fields.self_ = v;
    if (v.node.IsNull()) return fields;
    if (!v.node.IsMap()) return Fail(v, Cat("expected a map of keys, got ", DescribeNode(v.node)));
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      const YAML::Node key = it->first;
      const int key_line = LineOf(key, v.line);
      if (!key.IsScalar()) {
        return Fail({key, v.path, key_line}, Cat("expected a key name, got ", DescribeNode(key)));
      }
      const std::string name = key.Scalar();
      const std::string path = JoinPath(v.path, name);
      if (fields.Find(name) != nullptr) return Fail({key, path, key_line}, "duplicate key");
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        return Fail({key, path, key_line}, Cat("unknown key (expected one of: ", ListOf(allowed), ")"));
      }
      const YAML::Node value = it->second;
      const int line = value.IsNull() ? key_line : LineOf(value, key_line);
      fields.entries_.push_back({name, Value{value, path, line}});
    }
    return fields;
  }

  absl::StatusOr<std::vector<Value>> List(const Value& v, std::string_view items) const {
    std::vector<Value> out;
    if (v.node.IsNull()) return out;
    if (!v.node.IsSequence()) return Fail(v, Cat("expected a list of ", items, ", got ", DescribeNode(v.node)));
    for (size_t i = 0; i < v.node.size(); ++i) {
      out.push_back({v.node[i], Cat(v.path, "[", i, "]"), LineOf(v.node[i], v.line)});
    }
    return out;
  }

  absl::StatusOr<std::string> Scalar(const Value& v, std::string_view expected) const {
    if (!v.node.IsScalar()) return Fail(v, Cat("expected ", expected, ", got ", DescribeNode(v.node)));
    return v.node.Scalar();
  }

  absl::Status Int(const Value& v, int64_t min, int64_t max, int64_t& out) const {
    absl::StatusOr<std::string> text = Scalar(v, "an integer");
    if (!text.ok()) return text.status();
    int64_t value = 0;
    const char* end = text->data() + text->size();
    const auto [stop, ec] = std::from_chars(text->data(), end, value);
    if (ec != std::errc() || stop != end) return Fail(v, Cat("expected an integer, got \"", *text, "\""));
    if (value < min || value > max) return Fail(v, Cat("must be from ", min, " to ", max, ", got ", value));
    out = value;
    return absl::OkStatus();
  }

  absl::Status Dur(const Value& v, Duration min, Duration& out) const {
    absl::StatusOr<std::string> text = Scalar(v, "a duration such as 250ms or 10s");
    if (!text.ok()) return text.status();
    absl::StatusOr<Duration> d = ParseDuration(*text);
    if (!d.ok()) return Fail(v, d.status());
    if (*d < min) return Fail(v, Cat("must be at least ", FormatDuration(min), ", got ", *text));
    out = *d;
    return absl::OkStatus();
  }

  absl::Status RateOf(const Value& v, Rate& out) const {
    absl::StatusOr<std::string> text = Scalar(v, "a rate such as 100/s or 10/5s");
    if (!text.ok()) return text.status();
    absl::StatusOr<Rate> r = ParseRate(*text);
    if (!r.ok()) return Fail(v, r.status());
    out = *r;
    return absl::OkStatus();
  }

  absl::Status Choice(const Value& v, std::initializer_list<std::string_view> choices, size_t& out) const {
    const std::string expected = Cat("one of: ", ListOf(choices));
    absl::StatusOr<std::string> text = Scalar(v, expected);
    if (!text.ok()) return text.status();
    const auto it = std::find(choices.begin(), choices.end(), *text);
    if (it == choices.end()) return Fail(v, Cat("expected ", expected, "; got \"", *text, "\""));
    out = static_cast<size_t>(it - choices.begin());
    return absl::OkStatus();
  }

  absl::Status Name(const Value& v, std::string& out) const {
    absl::StatusOr<std::string> text = Scalar(v, "a name");
    if (!text.ok()) return text.status();
    if (text->empty() || text->size() > 64) return Fail(v, "a name is 1 to 64 characters long");
    for (char c : *text) {
      if (!std::isprint(static_cast<unsigned char>(c)) || c == ',' || c == '"') {
        return Fail(v, Cat("name \"", *text, "\" may not hold ',', '\"' or control characters"));
      }
    }
    out = *text;
    return absl::OkStatus();
  }

  absl::StatusOr<Scenario> Run(std::string_view yaml, const std::string& default_name) const;

 private:
  absl::Status ReadRetry(const Value& v, RetryPolicy& out) const;
  absl::Status ReadArrival(const Value& v, Duration duration, Arrival& out) const;
  absl::Status ReadGroup(const Value& v, Duration duration, ClientGroup& out) const;
  absl::Status ReadLimit(const Value& v, const Fields& f, LimitOptions& out) const;
  absl::Status ReadLimiter(const Value& v, LimiterSetup& out) const;

  std::string source_;
};

absl::Status Reader::ReadRetry(const Value& v, RetryPolicy& out) const {
  const std::initializer_list<std::string_view> kPolicies = {"never", "fixed", "retry_after",
                                                             "backoff"};
  static constexpr RetryKind kKinds[] = {RetryKind::kNever, RetryKind::kFixed,
                                         RetryKind::kRetryAfter, RetryKind::kBackoff};
  if (v.node.IsScalar()) {  // the short form: `retry: retry_after`
    size_t choice = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Choice(v, kPolicies, choice));
    if (kKinds[choice] == RetryKind::kFixed) return Fail(v, "fixed needs a delay: {policy: fixed, delay: 5s}");
    out = RetryPolicy{.kind = kKinds[choice]};
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f = Map(v, {"policy", "delay", "jitter", "base", "cap", "max_attempts"});
  if (!f.ok()) return f.status();
  const Value* policy = f->Find("policy");
  if (policy == nullptr) return Fail(f->Missing("policy"), Cat("required (", ListOf(kPolicies), ")"));
  size_t choice = 0;
  SLUICE_SIM_RETURN_IF_ERROR(Choice(*policy, kPolicies, choice));
  out = RetryPolicy{.kind = kKinds[choice]};
  auto only_for = [&](std::string_view key, std::initializer_list<RetryKind> kinds) -> absl::Status {
    const Value* x = f->Find(key);
    if (x == nullptr || std::find(kinds.begin(), kinds.end(), out.kind) != kinds.end()) {
      return absl::OkStatus();
    }
    return Fail(*x, Cat("does not apply to policy ", policy->node.Scalar()));
  };
  SLUICE_SIM_RETURN_IF_ERROR(only_for("delay", {RetryKind::kFixed}));
  SLUICE_SIM_RETURN_IF_ERROR(only_for("jitter", {RetryKind::kFixed, RetryKind::kRetryAfter}));
  SLUICE_SIM_RETURN_IF_ERROR(only_for("base", {RetryKind::kBackoff}));
  SLUICE_SIM_RETURN_IF_ERROR(only_for("cap", {RetryKind::kBackoff}));
  SLUICE_SIM_RETURN_IF_ERROR(
      only_for("max_attempts", {RetryKind::kFixed, RetryKind::kRetryAfter, RetryKind::kBackoff}));
  if (out.kind == RetryKind::kFixed) {
    const Value* delay = f->Find("delay");
    if (delay == nullptr) return Fail(f->Missing("delay"), "required for policy fixed");
    SLUICE_SIM_RETURN_IF_ERROR(Dur(*delay, Duration::Micros(1), out.delay));
  }
  if (const Value* x = f->Find("jitter")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.jitter));
  if (const Value* x = f->Find("base")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Micros(1), out.base));
  if (const Value* x = f->Find("cap")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Micros(1), out.cap));
  if (out.cap < out.base) return Fail(*f->Find("cap"), "must be at least base");
  if (const Value* x = f->Find("max_attempts")) {
    SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 1, 1'000'000, out.max_attempts));
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadArrival(const Value& v, Duration duration, Arrival& out) const {
  absl::StatusOr<Fields> f =
      Map(v, {"burst", "constant", "poisson", "diurnal", "at", "spread", "from", "until"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap()) return Fail(v, "expected a map such as {poisson: 10/s}");
  static constexpr std::string_view kKinds[] = {"burst", "constant", "poisson", "diurnal"};
  const Value* kind = nullptr;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    const Value* x = f->Find(kKinds[i]);
    if (x == nullptr) continue;
    if (kind != nullptr) return Fail(*x, Cat("one pattern per entry; this one already has ", kind->path.substr(kind->path.rfind('.') + 1)));
    kind = x;
    out.kind = static_cast<ArrivalKind>(i);
  }
  if (kind == nullptr) return Fail(v, "needs one of: burst, constant, poisson, diurnal");
  const bool burst = out.kind == ArrivalKind::kBurst;
  for (std::string_view key : {"at", "spread"}) {
    if (const Value* x = f->Find(key); x != nullptr && !burst) return Fail(*x, "applies only to burst (use from/until)");
  }
  for (std::string_view key : {"from", "until"}) {
    if (const Value* x = f->Find(key); x != nullptr && burst) return Fail(*x, "does not apply to burst (use at/spread)");
  }
  if (burst) {
    SLUICE_SIM_RETURN_IF_ERROR(Int(*kind, 0, kMaxAttempts, out.count));
    if (const Value* x = f->Find("at")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.from));
    if (const Value* x = f->Find("spread")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.spread));
    if (out.from >= duration) return Fail(f->Find("at") ? *f->Find("at") : *kind, "is at or after the scenario's end");
    return absl::OkStatus();
  }
  if (out.kind == ArrivalKind::kDiurnal) {
    absl::StatusOr<Fields> d = Map(*kind, {"low", "high", "peak_at", "cycle"});
    if (!d.ok()) return d.status();
    if (!kind->node.IsMap()) return Fail(*kind, "expected {low: RATE, high: RATE, peak_at: DURATION}");
    for (std::string_view key : {"low", "high"}) {
      const Value* x = d->Find(key);
      if (x == nullptr) return Fail(d->Missing(key), "required");
      SLUICE_SIM_RETURN_IF_ERROR(RateOf(*x, key == "low" ? out.low : out.rate));
    }
    if (const Value* x = d->Find("peak_at")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.peak_at));
    if (const Value* x = d->Find("cycle")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Seconds(1), out.cycle));
    // Compare per microsecond without rounding: low.limit/low.period vs rate.limit/rate.period.
    if (static_cast<__int128>(out.low.limit) * out.rate.period.micros() >
        static_cast<__int128>(out.rate.limit) * out.low.period.micros()) {
      return Fail(*d->Find("low"), "must not be above high");
    }
  } else {
    SLUICE_SIM_RETURN_IF_ERROR(RateOf(*kind, out.rate));
  }
  out.until = duration;
  if (const Value* x = f->Find("from")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.from));
  if (const Value* x = f->Find("until")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Micros(1), out.until));
  if (out.until <= out.from) return Fail(f->Find("until") ? *f->Find("until") : *f->Find("from"), "must end after it starts");
  return absl::OkStatus();
}

absl::Status Reader::ReadGroup(const Value& v, Duration duration, ClientGroup& out) const {
  absl::StatusOr<Fields> f = Map(v, {"name", "count", "key", "retry", "traffic"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap()) return Fail(v, "expected a client group (a map with name and traffic)");
  if (const Value* x = f->Find("name")) SLUICE_SIM_RETURN_IF_ERROR(Name(*x, out.name));
  if (const Value* x = f->Find("count")) SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 1, kMaxClients, out.clients));
  if (const Value* x = f->Find("key")) {
    size_t choice = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Choice(*x, {"client", "group", "global"}, choice));
    out.key = static_cast<KeyMode>(choice);
  }
  if (const Value* x = f->Find("retry")) SLUICE_SIM_RETURN_IF_ERROR(ReadRetry(*x, out.retry));
  const Value* traffic = f->Find("traffic");
  if (traffic == nullptr) return Fail(f->Missing("traffic"), "required (a list such as [{poisson: 10/s}])");
  absl::StatusOr<std::vector<Value>> items = List(*traffic, "arrival patterns");
  if (!items.ok()) return items.status();
  if (items->empty()) return Fail(*traffic, "needs at least one arrival pattern");
  for (const Value& item : *items) {
    Arrival a;
    SLUICE_SIM_RETURN_IF_ERROR(ReadArrival(item, duration, a));
    out.traffic.push_back(a);
  }
  return absl::OkStatus();
}

// The keys of one limit, as in a policy of the config file
// (docs/configuration.md), read from `f`.
absl::Status Reader::ReadLimit(const Value& v, const Fields& f, LimitOptions& out) const {
  const Value* algorithm = f.Find("algorithm");
  if (algorithm == nullptr) return Fail(f.Missing("algorithm"), "required");
  static constexpr std::string_view kAlgorithms =
      "token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, sliding_window";
  absl::StatusOr<std::string> name = Scalar(*algorithm, Cat("one of: ", kAlgorithms));
  if (!name.ok()) return name.status();
  const std::optional<Algorithm> a = AlgorithmFromName(*name);
  if (!a) return Fail(*algorithm, Cat("unknown algorithm \"", *name, "\" (expected one of: ", kAlgorithms, ")"));
  out.algorithm = *a;
  const Value* rate = f.Find("rate");
  const Value* limit = f.Find("limit");
  const Value* period = f.Find("period");
  if (rate != nullptr && (limit != nullptr || period != nullptr)) {
    return Fail(limit != nullptr ? *limit : *period, "set rate or limit + period, not both");
  }
  if (rate != nullptr) {
    SLUICE_SIM_RETURN_IF_ERROR(RateOf(*rate, out.rate));
  } else if (limit == nullptr || period == nullptr) {
    return Fail(f.Missing(limit == nullptr ? (period == nullptr ? "rate" : "limit") : "period"),
                "required (a rate such as 100/s, or limit + period)");
  } else {
    SLUICE_SIM_RETURN_IF_ERROR(Int(*limit, 1, kMaxLimit, out.rate.limit));
    SLUICE_SIM_RETURN_IF_ERROR(Dur(*period, Duration::Micros(1), out.rate.period));
    if (absl::Status s = ValidateRate(out.rate); !s.ok()) return Fail(*period, s);
  }
  if (const Value* x = f.Find("burst")) SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 1, kMaxLimit, out.burst));
  if (const Value* x = f.Find("mode")) {
    if (out.algorithm != Algorithm::kLeakyBucket) return Fail(*x, Cat("mode applies only to leaky_bucket, not ", *name));
    size_t mode = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Choice(*x, {"police", "shape"}, mode));
    out.mode = mode == 0 ? LeakyMode::kPolice : LeakyMode::kShape;
  }
  if (const Value* x = f.Find("max_delay")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), out.max_delay));
  if (const Value* x = f.Find("queue")) SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 0, kMaxLimit, out.queue));
  if (absl::StatusOr<LimitConfig> config = MakeLimit(out); !config.ok()) return Fail(v, config.status());
  return absl::OkStatus();
}

absl::Status Reader::ReadLimiter(const Value& v, LimiterSetup& out) const {
  const std::initializer_list<std::string_view> kLimitKeys = {
      "algorithm", "rate", "limit", "period", "burst", "mode", "max_delay", "queue"};
  absl::StatusOr<Fields> f = Map(v, {"name", "scope", "retry_after_jitter", "retry", "limits",
                                     "algorithm", "rate", "limit", "period", "burst", "mode",
                                     "max_delay", "queue"});
  if (!f.ok()) return f.status();
  if (!v.node.IsMap()) return Fail(v, "expected a limiter (a map with algorithm and rate, or limits)");
  if (const Value* x = f->Find("name")) SLUICE_SIM_RETURN_IF_ERROR(Name(*x, out.name));
  if (const Value* x = f->Find("scope")) {
    size_t choice = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Choice(*x, {"local", "shared"}, choice));
    out.scope = choice == 0 ? StateScope::kLocal : StateScope::kShared;
  }
  if (const Value* x = f->Find("retry_after_jitter")) {
    Duration jitter;
    SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), jitter));
    out.retry_after_jitter = jitter;
  }
  if (const Value* x = f->Find("retry")) {
    RetryPolicy retry;
    SLUICE_SIM_RETURN_IF_ERROR(ReadRetry(*x, retry));
    out.retry = retry;
  }
  const Value* limits = f->Find("limits");
  if (limits != nullptr) {
    for (std::string_view key : kLimitKeys) {
      if (const Value* x = f->Find(key)) return Fail(*x, "set the limit inline or under limits, not both");
    }
    absl::StatusOr<std::vector<Value>> items = List(*limits, "limits");
    if (!items.ok()) return items.status();
    if (items->empty()) return Fail(*limits, "needs at least one limit");
    for (const Value& item : *items) {
      absl::StatusOr<Fields> lf = Map(item, kLimitKeys);
      if (!lf.ok()) return lf.status();
      if (!item.node.IsMap()) return Fail(item, "expected a limit (a map with algorithm and rate)");
      LimitOptions limit;
      SLUICE_SIM_RETURN_IF_ERROR(ReadLimit(item, *lf, limit));
      out.limits.push_back(limit);
    }
  } else {
    LimitOptions limit;
    SLUICE_SIM_RETURN_IF_ERROR(ReadLimit(v, *f, limit));
    out.limits.push_back(limit);
  }
  const auto shapes = std::count_if(out.limits.begin(), out.limits.end(), [](const LimitOptions& l) {
    return l.algorithm == Algorithm::kLeakyBucket && l.mode == LeakyMode::kShape;
  });
  if (shapes > 1) return Fail(*limits, "at most one leaky_bucket shape limit per limiter");
  if (out.name.empty()) {
    for (const LimitOptions& l : out.limits) out.name += Cat(out.name.empty() ? "" : " + ", DescribeLimit(l));
  }
  return absl::OkStatus();
}

absl::StatusOr<Scenario> Reader::Run(std::string_view yaml, const std::string& default_name) const {
  YAML::Node root;
  try {
    const std::vector<YAML::Node> documents = internal::LoadAllDocuments(yaml);
    if (!documents.empty()) root = documents[0];
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(Cat(source_, ":", e.mark.line + 1, ": ", e.msg));
  }
  const Value top{root, "", 1};
  if (!root.IsMap()) return Fail(top, "expected a scenario (a map with duration, clients and limiters)");
  absl::StatusOr<Fields> f =
      Map(top, {"name", "description", "duration", "clock_start", "seed", "instances", "balance",
                "downstream", "contract", "clients", "limiters"});
  if (!f.ok()) return f.status();
  Scenario s;
  s.name = default_name;
  if (const Value* x = f->Find("name")) SLUICE_SIM_RETURN_IF_ERROR(Name(*x, s.name));
  if (const Value* x = f->Find("description")) {
    absl::StatusOr<std::string> text = Scalar(*x, "text");
    if (!text.ok()) return text.status();
    s.description = *text;
  }
  const Value* duration = f->Find("duration");
  if (duration == nullptr) return Fail(f->Missing("duration"), "required (how long to simulate, e.g. 10m)");
  SLUICE_SIM_RETURN_IF_ERROR(Dur(*duration, Duration::Seconds(1), s.duration));
  if (s.duration > kMaxDuration) return Fail(*duration, Cat("the longest is ", FormatDuration(kMaxDuration)));
  if (const Value* x = f->Find("clock_start")) SLUICE_SIM_RETURN_IF_ERROR(Dur(*x, Duration::Zero(), s.clock_start));
  if (const Value* x = f->Find("seed")) {
    int64_t seed = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 0, std::numeric_limits<int64_t>::max(), seed));
    s.seed = static_cast<uint64_t>(seed);
  }
  if (const Value* x = f->Find("instances")) SLUICE_SIM_RETURN_IF_ERROR(Int(*x, 1, kMaxInstances, s.instances));
  if (const Value* x = f->Find("balance")) {
    size_t choice = 0;
    SLUICE_SIM_RETURN_IF_ERROR(Choice(*x, {"round_robin", "sticky"}, choice));
    s.balance = choice == 0 ? Balance::kRoundRobin : Balance::kSticky;
  }
  if (const Value* x = f->Find("downstream")) {
    absl::StatusOr<Fields> d = Map(*x, {"capacity", "queue"});
    if (!d.ok()) return d.status();
    const Value* capacity = d->Find("capacity");
    if (capacity == nullptr) return Fail(d->Missing("capacity"), "required (a rate such as 40/s)");
    Downstream down;
    SLUICE_SIM_RETURN_IF_ERROR(RateOf(*capacity, down.capacity));
    if (down.capacity.limit > 1'000'000) return Fail(*capacity, "at most 1000000 per period");
    if (const Value* q = d->Find("queue")) SLUICE_SIM_RETURN_IF_ERROR(Int(*q, 0, kMaxAttempts, down.queue));
    s.downstream = down;
  }
  if (const Value* x = f->Find("contract")) {
    Rate contract;
    SLUICE_SIM_RETURN_IF_ERROR(RateOf(*x, contract));
    s.contract = contract;
  }

  const Value* clients = f->Find("clients");
  if (clients == nullptr) return Fail(f->Missing("clients"), "required (a list of client groups)");
  absl::StatusOr<std::vector<Value>> groups = List(*clients, "client groups");
  if (!groups.ok()) return groups.status();
  if (groups->empty()) return Fail(*clients, "needs at least one client group");
  std::set<std::string> group_names;
  int64_t total_clients = 0;
  for (size_t i = 0; i < groups->size(); ++i) {
    ClientGroup g{.name = Cat("clients", i)};
    SLUICE_SIM_RETURN_IF_ERROR(ReadGroup((*groups)[i], s.duration, g));
    if (!group_names.insert(g.name).second) return Fail((*groups)[i], Cat("a second group named ", g.name));
    total_clients += g.clients;
    if (total_clients > kMaxClients) return Fail((*groups)[i], Cat("more than ", kMaxClients, " clients in all"));
    s.groups.push_back(std::move(g));
  }

  const Value* limiters = f->Find("limiters");
  if (limiters == nullptr) return Fail(f->Missing("limiters"), "required (the limits to compare)");
  absl::StatusOr<std::vector<Value>> items = List(*limiters, "limiters");
  if (!items.ok()) return items.status();
  if (items->empty()) return Fail(*limiters, "needs at least one limiter");
  std::set<std::string> names;
  for (const Value& item : *items) {
    LimiterSetup l;
    SLUICE_SIM_RETURN_IF_ERROR(ReadLimiter(item, l));
    if (!names.insert(l.name).second) {
      return Fail(item, Cat("a second limiter named \"", l.name, "\" (give it a name:)"));
    }
    s.limiters.push_back(std::move(l));
  }
  return s;
}

}  // namespace

absl::StatusOr<Scenario> ParseScenario(std::string_view yaml, const std::string& source,
                                       const std::string& default_name) {
  return Reader(source).Run(yaml, default_name);
}

absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path) {
  absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
  if (!text.ok()) return text.status();
  std::string stem = path.substr(path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.find('.'));
  return ParseScenario(*text, path, stem.empty() ? "scenario" : stem);
}

}  // namespace sluice::sim
