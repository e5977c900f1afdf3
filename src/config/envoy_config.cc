// The reader of envoyproxy/ratelimit's YAML format (sluice/envoy_config.h).
//
// Walked by hand, like the main config (config.cc), so that every error
// names the file, the line and the key. The few walking helpers are
// repeated here rather than shared: the main config's live in its parser
// class, and this format's rules (keys that envoyproxy/ratelimit knows but
// sluice does not implement) are its own.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/cat.h"
#include "config/envoy_yaml.h"
#include "config/yaml_text.h"
#include "sluice/envoy_config.h"
#include "sluice/rate.h"

#define SLUICE_RETURN_IF_ERROR(expr)                                  \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (0)

namespace sluice {
namespace {

using internal::Cat;
using internal::DescribeNode;
using internal::JoinPath;
using internal::LineOf;
using internal::YamlAt;

// Deeper nesting is no real config, and the walk recurses once per level.
constexpr int kMaxDepth = 32;
constexpr size_t kMaxNameLength = 256;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Keys envoyproxy/ratelimit (or a fork of it) reads that sluice does not
// implement: reported by name, never skipped.
struct Unsupported {
  std::string_view key;
  std::string_view why;
};

class Reader {
 public:
  Reader(std::string source, EnvoyParseOptions options)
      : source_(std::move(source)), options_(options) {}

  absl::Status Fail(const YamlAt& at, std::string_view message) const {
    if (at.path.empty()) return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", message));
    return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", at.path, ": ", message));
  }

  absl::StatusOr<EnvoyDomain> Domain(const YamlAt& v) const;

 private:
  using Fields = std::map<std::string, YamlAt, std::less<>>;

  absl::StatusOr<Fields> ReadMap(const YamlAt& v, std::string_view what,
                                 std::initializer_list<std::string_view> allowed,
                                 std::initializer_list<Unsupported> unsupported = {}) const;
  absl::StatusOr<std::vector<YamlAt>> ReadList(const YamlAt& v, std::string_view items) const;
  absl::StatusOr<std::string> ReadScalar(const YamlAt& v, std::string_view expected) const;
  absl::Status ReadBool(const YamlAt& v, bool& out) const;
  absl::Status ReadInt(const YamlAt& v, int64_t min, int64_t max, int64_t& out) const;
  absl::Status ReadText(const YamlAt& v, std::string_view what, std::string& out) const;

  absl::Status Descriptors(const YamlAt& v, int depth, std::vector<EnvoyDescriptor>& out) const;
  absl::Status Descriptor(const YamlAt& v, int depth, EnvoyDescriptor& out) const;
  absl::Status RateLimit(const YamlAt& v, EnvoyRateLimit& out) const;
  absl::Status CheckReplaces(const EnvoyDomain& domain) const;

  std::string source_;
  EnvoyParseOptions options_;
  // Each `replaces` name read in the current domain, and where.
  mutable std::vector<std::pair<YamlAt, std::string>> replaces_;
  // What the current domain holds that is read and then not acted on.
  mutable std::vector<std::string> warnings_;
};

absl::StatusOr<Reader::Fields> Reader::ReadMap(const YamlAt& v, std::string_view what,
                                               std::initializer_list<std::string_view> allowed,
                                               std::initializer_list<Unsupported> unsupported) const {
  Fields fields;
  if (v.node.IsNull()) return fields;
  if (!v.node.IsMap()) return Fail(v, Cat("expected ", what, ", got ", DescribeNode(v.node)));
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    const YAML::Node key = it->first;
    const int key_line = LineOf(key, v.line);
    if (!key.IsScalar()) {
      return Fail({key, v.path, key_line}, Cat("expected a key name, got ", DescribeNode(key)));
    }
    const std::string name = key.Scalar();
    const YamlAt at{key, JoinPath(v.path, name), key_line};
    if (auto first = fields.find(name); first != fields.end()) {
      return Fail(at, Cat("duplicate key (first at line ", first->second.line, ")"));
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      for (const Unsupported& u : unsupported) {
        if (u.key == name) return Fail(at, Cat("not supported by sluice: ", u.why));
      }
      std::string expected;
      for (std::string_view a : allowed) expected += Cat(expected.empty() ? "" : ", ", a);
      return Fail(at, Cat("unknown key (expected one of: ", expected, ")"));
    }
    const YAML::Node value = it->second;
    const int line = value.IsNull() ? key_line : LineOf(value, key_line);
    fields.emplace(name, YamlAt{value, at.path, line});
  }
  return fields;
}

absl::StatusOr<std::vector<YamlAt>> Reader::ReadList(const YamlAt& v,
                                                     std::string_view items) const {
  std::vector<YamlAt> out;
  if (v.node.IsNull()) return out;
  if (!v.node.IsSequence()) {
    return Fail(v, Cat("expected a list of ", items, ", got ", DescribeNode(v.node)));
  }
  for (size_t i = 0; i < v.node.size(); ++i) {
    const YAML::Node item = v.node[i];
    out.push_back({item, Cat(v.path, "[", i, "]"), LineOf(item, v.line)});
  }
  return out;
}

absl::StatusOr<std::string> Reader::ReadScalar(const YamlAt& v, std::string_view expected) const {
  if (!v.node.IsScalar()) return Fail(v, Cat("expected ", expected, ", got ", DescribeNode(v.node)));
  return v.node.Scalar();
}

absl::Status Reader::ReadBool(const YamlAt& v, bool& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "true or false");
  if (!text.ok()) return text.status();
  if (!YAML::convert<bool>::decode(v.node, out)) {
    return Fail(v, Cat("expected true or false, got \"", *text, "\""));
  }
  return absl::OkStatus();
}

absl::Status Reader::ReadInt(const YamlAt& v, int64_t min, int64_t max, int64_t& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "an integer");
  if (!text.ok()) return text.status();
  const char* end = text->data() + text->size();
  int64_t value = 0;
  const auto [stop, ec] = std::from_chars(text->data(), end, value);
  if (ec != std::errc() || stop != end) {
    return Fail(v, Cat("expected an integer, got \"", *text, "\""));
  }
  if (value < min || value > max) return Fail(v, Cat("must be from ", min, " to ", max, ", got ", value));
  out = value;
  return absl::OkStatus();
}

// Keys, values and names: any non-empty text, printable, of bounded length.
absl::Status Reader::ReadText(const YamlAt& v, std::string_view what, std::string& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, what);
  if (!text.ok()) return text.status();
  if (text->empty()) return Fail(v, "must not be empty");
  if (text->size() > kMaxNameLength) {
    return Fail(v, Cat("is ", text->size(), " bytes long, the most is ", kMaxNameLength));
  }
  if (std::any_of(text->begin(), text->end(), [](char c) { return c >= 0 && c < 0x20; })) {
    return Fail(v, "must not hold control characters");
  }
  out = *std::move(text);
  return absl::OkStatus();
}

absl::StatusOr<EnvoyDomain> Reader::Domain(const YamlAt& v) const {
  absl::StatusOr<Fields> f = ReadMap(v, "a domain (a map with domain and descriptors)",
                                     {"domain", "descriptors"});
  if (!f.ok()) return f.status();
  EnvoyDomain out;
  out.source = source_;
  auto domain = f->find("domain");
  if (domain == f->end()) return Fail({v.node, JoinPath(v.path, "domain"), v.line}, "required");
  SLUICE_RETURN_IF_ERROR(ReadText(domain->second, "a domain name", out.domain));
  out.line = domain->second.line;
  replaces_.clear();
  warnings_.clear();
  if (auto d = f->find("descriptors"); d != f->end()) {
    SLUICE_RETURN_IF_ERROR(Descriptors(d->second, 1, out.descriptors));
  }
  SLUICE_RETURN_IF_ERROR(CheckReplaces(out));
  out.warnings = std::move(warnings_);
  return out;
}

absl::Status Reader::Descriptors(const YamlAt& v, int depth,
                                 std::vector<EnvoyDescriptor>& out) const {
  if (depth > kMaxDepth) return Fail(v, Cat("descriptors nest deeper than ", kMaxDepth, " levels"));
  absl::StatusOr<std::vector<YamlAt>> items = ReadList(v, "descriptors");
  if (!items.ok()) return items.status();
  for (const YamlAt& item : *items) {
    EnvoyDescriptor d;
    SLUICE_RETURN_IF_ERROR(Descriptor(item, depth, d));
    // envoyproxy/ratelimit refuses the same key and value twice on a level
    // too: which of the two applies would otherwise depend on file order.
    for (const EnvoyDescriptor& other : out) {
      if (other.key == d.key && other.value == d.value) {
        return Fail(item, Cat("duplicate descriptor key \"", d.key, "\"",
                              d.value ? Cat(" value \"", *d.value, "\"") : std::string(" (any value)"),
                              " (first at line ", other.line, ")"));
      }
    }
    out.push_back(std::move(d));
  }
  return absl::OkStatus();
}

absl::Status Reader::Descriptor(const YamlAt& v, int depth, EnvoyDescriptor& out) const {
  if (!v.node.IsMap()) {
    return Fail(v, Cat("expected a descriptor (a map with key, value, rate_limit, descriptors), got ",
                       DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(
      v, "a descriptor",
      {"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "metadata"},
      {{"value_to_metric", "descriptor values in metric names (sluice's metrics are per rule)"},
       {"share_threshold", "one shared limit for all values matching a wildcard (in sluice each "
                           "value has its own state)"},
       {"quota_mode", "soft limits that admit requests over the limit and report them in "
                      "dynamic metadata (sluice denies over the limit and sends no dynamic "
                      "metadata; use shadow_mode to count without denying)"}});
  if (!f.ok()) return f.status();
  out.line = v.line;
  auto key = f->find("key");
  if (key == f->end()) return Fail({v.node, JoinPath(v.path, "key"), v.line}, "required");
  SLUICE_RETURN_IF_ERROR(ReadText(key->second, "a descriptor key", out.key));
  if (auto x = f->find("value"); x != f->end() && !x->second.node.IsNull()) {
    absl::StatusOr<std::string> value = ReadScalar(x->second, "a descriptor value");
    if (!value.ok()) return value.status();
    // As in envoyproxy/ratelimit, an empty value is no value: any value matches.
    if (!value->empty()) {
      std::string text;
      SLUICE_RETURN_IF_ERROR(ReadText(x->second, "a descriptor value", text));
      out.value = std::move(text);
    }
  }
  if (auto x = f->find("rate_limit"); x != f->end()) {
    out.rate_limit.emplace();
    SLUICE_RETURN_IF_ERROR(RateLimit(x->second, *out.rate_limit));
  }
  if (auto x = f->find("shadow_mode"); x != f->end()) {
    SLUICE_RETURN_IF_ERROR(ReadBool(x->second, out.shadow_mode));
  }
  if (auto x = f->find("detailed_metric"); x != f->end()) {
    SLUICE_RETURN_IF_ERROR(ReadBool(x->second, out.detailed_metric));
  }
  if (auto x = f->find("descriptors"); x != f->end()) {
    SLUICE_RETURN_IF_ERROR(Descriptors(x->second, depth + 1, out.descriptors));
  }
  if (auto x = f->find("metadata"); x != f->end()) {
    // It only feeds the dynamic metadata of an answer, which sluice does not
    // send: decisions are the same with or without it.
    warnings_.push_back(Cat(source_, ":", x->second.line, ": ", x->second.path,
                            ": ignored: sluice sends no dynamic metadata"));
  }
  if (out.shadow_mode && !out.rate_limit) {
    // envoyproxy/ratelimit loads it too; it does nothing there.
    const YamlAt& at = f->at("shadow_mode");
    warnings_.push_back(Cat(source_, ":", at.line, ": ", at.path,
                            ": ignored: no rate_limit on this descriptor"));
    out.shadow_mode = false;
  }
  return absl::OkStatus();
}

absl::Status Reader::RateLimit(const YamlAt& v, EnvoyRateLimit& out) const {
  absl::StatusOr<Fields> f = ReadMap(
      v, "a rate_limit (a map with unit and requests_per_unit)",
      {"unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces",
       "algorithm", "rate", "limit", "period", "burst", "scope"},
      {{"mode", "leaky_bucket mode shape (Envoy cannot hold a request for its departure time; "
                "leaky_bucket here polices)"},
       {"max_delay", "shaping delays (Envoy cannot hold a request)"},
       {"queue", "shaping queues (Envoy cannot hold a request)"}});
  if (!f.ok()) return f.status();
  auto find = [&](std::string_view key) -> const YamlAt* {
    auto it = f->find(key);
    return it == f->end() ? nullptr : &it->second;
  };
  if (const YamlAt* x = find("name")) SLUICE_RETURN_IF_ERROR(ReadText(*x, "a name", out.name));
  if (const YamlAt* x = find("replaces")) {
    absl::StatusOr<std::vector<YamlAt>> items = ReadList(*x, "{name: ...} maps");
    if (!items.ok()) return items.status();
    for (const YamlAt& item : *items) {
      absl::StatusOr<Fields> r = ReadMap(item, "a map {name: ...}", {"name"});
      if (!r.ok()) return r.status();
      auto name = r->find("name");
      if (name == r->end()) return Fail({item.node, JoinPath(item.path, "name"), item.line}, "required");
      std::string replaced;
      SLUICE_RETURN_IF_ERROR(ReadText(name->second, "a name", replaced));
      if (replaced == out.name) return Fail(name->second, "a limit cannot replace itself");
      replaces_.emplace_back(name->second, replaced);
      out.replaces.push_back(std::move(replaced));
    }
  }
  if (const YamlAt* x = find("unlimited")) SLUICE_RETURN_IF_ERROR(ReadBool(*x, out.unlimited));
  if (out.unlimited) {
    // As envoyproxy/ratelimit: a unit is refused; its `replaces` apply.
    for (std::string_view key : {"unit", "unit_multiplier", "algorithm", "rate", "limit", "period",
                                 "burst", "scope"}) {
      if (const YamlAt* x = find(key)) {
        return Fail(*x, Cat(key, " does not apply to an unlimited rate_limit (unlimited: true)"));
      }
    }
    if (const YamlAt* x = find("requests_per_unit")) {
      // envoyproxy/ratelimit loads it too, and ignores it.
      warnings_.push_back(Cat(source_, ":", x->line, ": ", x->path,
                              ": ignored: the rate_limit is unlimited"));
    }
    return absl::OkStatus();
  }

  const YamlAt* unit = find("unit");
  const YamlAt* per_unit = find("requests_per_unit");
  const YamlAt* rate = find("rate");
  const YamlAt* limit = find("limit");
  const YamlAt* period = find("period");
  LimitOptions& options = out.limit.options;
  options.algorithm = Algorithm::kFixedWindow;  // what envoyproxy/ratelimit counts with
  const YamlAt* multiplier = find("unit_multiplier");
  if (multiplier != nullptr && unit == nullptr) {
    return Fail(*multiplier, "applies to unit + requests_per_unit");
  }
  if ((unit != nullptr || per_unit != nullptr) && (rate != nullptr || limit != nullptr || period != nullptr)) {
    const YamlAt* second = rate != nullptr ? rate : limit != nullptr ? limit : period;
    return Fail(*second, "set unit + requests_per_unit, or rate (or limit + period), not both");
  }
  if (unit != nullptr || per_unit != nullptr) {
    if (unit == nullptr) return Fail({v.node, JoinPath(v.path, "unit"), v.line}, "required with requests_per_unit");
    if (per_unit == nullptr) {
      // envoyproxy/ratelimit reads a missing number as 0, which denies every
      // request; that is too easy to do by accident to do silently.
      return Fail({v.node, JoinPath(v.path, "requests_per_unit"), v.line},
                  "required with unit (0 denies every request; write it when that is meant)");
    }
    absl::StatusOr<std::string> name = ReadScalar(*unit, "a unit");
    if (!name.ok()) return name.status();
    static constexpr EnvoyUnit kUnits[] = {EnvoyUnit::kSecond, EnvoyUnit::kMinute, EnvoyUnit::kHour,
                                           EnvoyUnit::kDay,    EnvoyUnit::kWeek,   EnvoyUnit::kMonth,
                                           EnvoyUnit::kYear};
    const std::string lower = Lower(*name);
    for (EnvoyUnit u : kUnits) {
      if (lower == EnvoyUnitName(u)) out.unit = u;
    }
    if (out.unit == EnvoyUnit::kUnknown) {
      return Fail(*unit, Cat("unknown unit \"", *name,
                             "\" (expected one of: second, minute, hour, day, week, month, year)"));
    }
    int64_t n = 0;
    SLUICE_RETURN_IF_ERROR(ReadInt(*per_unit, 0, std::numeric_limits<uint32_t>::max(), n));
    out.requests_per_unit = static_cast<uint32_t>(n);
    out.deny_all = n == 0;
    // unit_multiplier: N: one window of N units (as envoyproxy/ratelimit).
    int64_t times = 1;
    if (multiplier != nullptr) {
      // Bounded so that the window is at most kMaxPeriod (366 days).
      SLUICE_RETURN_IF_ERROR(ReadInt(
          *multiplier, 1, kMaxPeriod.micros() / EnvoyUnitLength(out.unit).micros(), times));
    }
    options.rate = Rate{.limit = n, .period = EnvoyUnitLength(out.unit) * times};
  } else if (rate != nullptr) {
    absl::StatusOr<std::string> text = ReadScalar(*rate, "a rate such as 100/s or 10/5s");
    if (!text.ok()) return text.status();
    absl::StatusOr<Rate> r = ParseRate(*text);
    if (!r.ok()) return Fail(*rate, Message(r.status()));
    options.rate = *r;
  } else if (limit != nullptr || period != nullptr) {
    if (limit == nullptr) return Fail({v.node, JoinPath(v.path, "limit"), v.line}, "required with period");
    if (period == nullptr) return Fail({v.node, JoinPath(v.path, "period"), v.line}, "required with limit");
    SLUICE_RETURN_IF_ERROR(ReadInt(*limit, 1, kMaxLimit, options.rate.limit));
    absl::StatusOr<std::string> text = ReadScalar(*period, "a duration such as 5s");
    if (!text.ok()) return text.status();
    absl::StatusOr<Duration> d = ParseDuration(*text);
    if (!d.ok()) return Fail(*period, Message(d.status()));
    options.rate.period = *d;
    if (absl::Status s = ValidateRate(options.rate); !s.ok()) return Fail(*period, Message(s));
  } else {
    return Fail({v.node, JoinPath(v.path, "unit"), v.line},
                "required: unit + requests_per_unit, rate, or unlimited: true");
  }
  if (rate != nullptr || limit != nullptr) {
    // Reported back to Envoy in Envoy's terms when the period is one of its units.
    out.requests_per_unit = static_cast<uint32_t>(
        std::min<int64_t>(options.rate.limit, std::numeric_limits<uint32_t>::max()));
    for (EnvoyUnit u : {EnvoyUnit::kSecond, EnvoyUnit::kMinute, EnvoyUnit::kHour, EnvoyUnit::kDay,
                        EnvoyUnit::kWeek, EnvoyUnit::kMonth, EnvoyUnit::kYear}) {
      if (EnvoyUnitLength(u) == options.rate.period) out.unit = u;
    }
  }

  if (const YamlAt* x = find("algorithm")) {
    absl::StatusOr<std::string> name = ReadScalar(*x, "an algorithm");
    if (!name.ok()) return name.status();
    const std::optional<Algorithm> a = AlgorithmFromName(*name);
    if (!a) {
      return Fail(*x, Cat("unknown algorithm \"", *name,
                          "\" (expected one of: token_bucket, gcra, leaky_bucket, fixed_window, "
                          "sliding_log, sliding_window)"));
    }
    options.algorithm = *a;
  }
  if (const YamlAt* x = find("burst")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 1, std::numeric_limits<int64_t>::max(), options.burst));
  }
  out.limit.scope = options_.shared_store ? Scope::kGlobal : Scope::kLocal;
  if (const YamlAt* x = find("scope")) {
    absl::StatusOr<std::string> text = ReadScalar(*x, "local or global");
    if (!text.ok()) return text.status();
    if (*text == "local") {
      out.limit.scope = Scope::kLocal;
    } else if (*text == "global") {
      if (!options_.shared_store) {
        return Fail(*x, "global needs a shared store (store.redis), none is configured");
      }
      out.limit.scope = Scope::kGlobal;
    } else {
      return Fail(*x, Cat("expected one of: local, global; got \"", *text, "\""));
    }
  }
  if (out.deny_all) {
    for (std::string_view key : {"algorithm", "burst"}) {
      if (const YamlAt* x = find(key)) {
        return Fail(*x, Cat(key, " does not apply with requests_per_unit: 0 (every request is denied)"));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<LimitConfig> made = MakeLimit(options);
  if (!made.ok()) return Fail(v, Message(made.status()));
  return absl::OkStatus();
}

// A `replaces` naming no limit of the domain would do nothing: a typo.
absl::Status Reader::CheckReplaces(const EnvoyDomain& domain) const {
  std::set<std::string, std::less<>> names;
  auto walk = [&](auto& self, const std::vector<EnvoyDescriptor>& level) -> void {
    for (const EnvoyDescriptor& d : level) {
      if (d.rate_limit && !d.rate_limit->name.empty()) names.insert(d.rate_limit->name);
      self(self, d.descriptors);
    }
  };
  walk(walk, domain.descriptors);
  for (const auto& [at, name] : replaces_) {
    if (!names.contains(name)) {
      return Fail(at, Cat("no rate_limit of domain \"", domain.domain, "\" is named \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EnvoyDomain> ParseDocument(std::string_view yaml, const std::string& source,
                                          EnvoyParseOptions options) {
  std::vector<YAML::Node> documents;
  try {
    documents = internal::LoadAllDocuments(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        Cat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  Reader reader(source, options);
  if (documents.empty()) return reader.Fail({YAML::Node(), "", 1}, "empty: expected domain and descriptors");
  if (documents.size() > 1) {
    return reader.Fail({documents[1], "", LineOf(documents[1], 1)},
                       "an envoy rate limit file holds one domain; a second YAML document starts here");
  }
  return reader.Domain({documents[0], "", LineOf(documents[0], 1)});
}

}  // namespace

Duration EnvoyUnitLength(EnvoyUnit unit) {
  switch (unit) {
    case EnvoyUnit::kSecond: return Duration::Seconds(1);
    case EnvoyUnit::kMinute: return Duration::Minutes(1);
    case EnvoyUnit::kHour: return Duration::Hours(1);
    case EnvoyUnit::kDay: return Duration::Days(1);
    case EnvoyUnit::kWeek: return Duration::Days(7);
    case EnvoyUnit::kMonth: return Duration::Days(30);
    case EnvoyUnit::kYear: return Duration::Days(365);
    case EnvoyUnit::kUnknown: break;
  }
  return Duration::Zero();
}

std::string_view EnvoyUnitName(EnvoyUnit unit) {
  switch (unit) {
    case EnvoyUnit::kSecond: return "second";
    case EnvoyUnit::kMinute: return "minute";
    case EnvoyUnit::kHour: return "hour";
    case EnvoyUnit::kDay: return "day";
    case EnvoyUnit::kWeek: return "week";
    case EnvoyUnit::kMonth: return "month";
    case EnvoyUnit::kYear: return "year";
    case EnvoyUnit::kUnknown: break;
  }
  return "unknown";
}

absl::StatusOr<EnvoyDomain> ParseEnvoyDomain(std::string_view yaml, const std::string& source,
                                             EnvoyParseOptions options) {
  try {
    return ParseDocument(yaml, source, options);
  } catch (const YAML::Exception& e) {
    // The walk checks every node's type before reading it; this is a guard.
    return absl::InvalidArgumentError(Cat(source, ": cannot read the YAML: ", e.what()));
  }
}

absl::StatusOr<EnvoyDomain> LoadEnvoyFile(const std::string& path, EnvoyParseOptions options) {
  absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
  if (!text.ok()) return text.status();
  return ParseEnvoyDomain(*text, path, options);
}

namespace internal {

absl::StatusOr<std::shared_ptr<const EnvoyConfig>> ReadEnvoySection(
    const std::string& source, const std::optional<YamlAt>& envoy,
    const std::optional<YamlAt>& envoy_files, const EnvoyParseOptions& options) {
  auto config = std::make_shared<EnvoyConfig>();
  Reader reader(source, options);
  // domain -> "file:line" of its first appearance
  std::map<std::string, std::string, std::less<>> seen;
  auto add = [&](EnvoyDomain domain, const YamlAt& at, const Reader& where) -> absl::Status {
    auto [it, inserted] = seen.emplace(domain.domain, Cat(domain.source, ":", domain.line));
    if (!inserted) {
      return where.Fail(at, Cat("duplicate domain \"", domain.domain, "\" (first at ", it->second, ")"));
    }
    config->domains.push_back(std::move(domain));
    return absl::OkStatus();
  };
  if (envoy) {
    if (!envoy->node.IsNull() && !envoy->node.IsSequence()) {
      return reader.Fail(*envoy, Cat("expected a list of domains (- domain: ...), got ",
                                     DescribeNode(envoy->node)));
    }
    for (size_t i = 0; envoy->node.IsSequence() && i < envoy->node.size(); ++i) {
      const YAML::Node item = envoy->node[i];
      const YamlAt at{item, Cat(envoy->path, "[", i, "]"), LineOf(item, envoy->line)};
      absl::StatusOr<EnvoyDomain> domain = reader.Domain(at);
      if (!domain.ok()) return domain.status();
      const YamlAt domain_at{item, JoinPath(at.path, "domain"), domain->line};
      SLUICE_RETURN_IF_ERROR(add(*std::move(domain), domain_at, reader));
    }
  }
  if (envoy_files) {
    if (!envoy_files->node.IsNull() && !envoy_files->node.IsSequence()) {
      return reader.Fail(*envoy_files, Cat("expected a list of file paths, got ",
                                           DescribeNode(envoy_files->node)));
    }
    const size_t slash = source.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : source.substr(0, slash + 1);
    for (size_t i = 0; envoy_files->node.IsSequence() && i < envoy_files->node.size(); ++i) {
      const YAML::Node item = envoy_files->node[i];
      const YamlAt at{item, Cat(envoy_files->path, "[", i, "]"), LineOf(item, envoy_files->line)};
      if (!item.IsScalar() || item.Scalar().empty()) {
        return reader.Fail(at, Cat("expected a file path, got ", DescribeNode(item)));
      }
      const std::string& given = item.Scalar();
      const std::string path = given.front() == '/' ? given : dir + given;
      absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
      if (!text.ok()) return reader.Fail(at, Message(text.status()));
      absl::StatusOr<EnvoyDomain> domain = ParseEnvoyDomain(*text, path, options);
      if (!domain.ok()) return domain.status();
      const Reader file_reader(path, options);
      const YamlAt domain_at{YAML::Node(), "domain", domain->line};
      SLUICE_RETURN_IF_ERROR(add(*std::move(domain), domain_at, file_reader));
    }
  }
  return std::shared_ptr<const EnvoyConfig>(std::move(config));
}

}  // namespace internal
}  // namespace sluice
