// The reader of envoyproxy/ratelimit's YAML format (sluice/envoy_config.h).
//
// Walked by hand with the reader every sluice file format shares
// (config/yaml_reader.h), so that every error names the file, the line and
// the key. What is this format's own stays here: keys envoyproxy/ratelimit
// knows but sluice does not implement, units, descriptors and `replaces`.
#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/ascii.h"
#include "base/cat.h"
#include "config/envoy_yaml.h"
#include "config/yaml_reader.h"
#include "config/yaml_text.h"
#include "sluice/envoy_config.h"
#include "sluice/rate.h"

namespace sluice {
namespace {

using internal::Cat;
using internal::DescribeNode;
using internal::JoinPath;
using internal::kMaxDescriptorTextLength;
using internal::YamlAt;

// Deeper nesting is no real config, and the walk recurses once per level.
constexpr int kMaxDepth = 32;

class Reader : public internal::YamlReader {
 public:
  Reader(std::string source, EnvoyParseOptions options)
      : YamlReader(std::move(source)), options_(options) {}

  absl::StatusOr<EnvoyDomain> Domain(const YamlAt& v) const;

 private:
  absl::Status Descriptors(const YamlAt& v, int depth, std::vector<EnvoyDescriptor>& out) const;
  absl::Status Descriptor(const YamlAt& v, int depth, EnvoyDescriptor& out) const;
  absl::Status RateLimit(const YamlAt& v, EnvoyRateLimit& out) const;
  absl::Status CheckReplaces(const EnvoyDomain& domain) const;

  EnvoyParseOptions options_;
  // Each `replaces` name read in the current domain, and where.
  mutable std::vector<std::pair<YamlAt, std::string>> replaces_;
  // What the current domain holds that is read and then not acted on.
  mutable std::vector<std::string> warnings_;
};

absl::StatusOr<EnvoyDomain> Reader::Domain(const YamlAt& v) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, "a domain (a map with domain and descriptors)", {"domain", "descriptors"});
  if (!f.ok()) return f.status();
  EnvoyDomain out;
  out.source = source();
  const YamlAt* domain = f->Find("domain");
  if (domain == nullptr) return Fail(f->Missing("domain"), "required");
  SLUICE_ASSIGN_OR_RETURN(out.domain, ReadText(*domain, "a domain name", kMaxDescriptorTextLength));
  out.line = domain->line;
  replaces_.clear();
  warnings_.clear();
  if (const YamlAt* d = f->Find("descriptors")) {
    SLUICE_RETURN_IF_ERROR(Descriptors(*d, 1, out.descriptors));
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
        return Fail(item,
                    Cat("duplicate descriptor key \"", d.key, "\"",
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
    return Fail(v,
                Cat("expected a descriptor (a map with key, value, rate_limit, descriptors), got ",
                    DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(
      v, "a descriptor",
      {"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "metadata",
       "share_threshold"},
      {{"value_to_metric", "descriptor values in metric names (sluice's metrics are per rule)"},
       {"quota_mode",
        "soft limits that admit requests over the limit and report them in "
        "dynamic metadata (sluice denies over the limit and sends no dynamic "
        "metadata; use shadow_mode to count without denying)"}});
  if (!f.ok()) return f.status();
  out.line = v.line;
  const YamlAt* key = f->Find("key");
  if (key == nullptr) return Fail(f->Missing("key"), "required");
  SLUICE_ASSIGN_OR_RETURN(out.key, ReadText(*key, "a descriptor key", kMaxDescriptorTextLength));
  if (const YamlAt* x = f->Find("value"); x != nullptr && !x->node.IsNull()) {
    absl::StatusOr<std::string> value = ReadScalar(*x, "a descriptor value");
    if (!value.ok()) return value.status();
    // As in envoyproxy/ratelimit, an empty value is no value: any value matches.
    if (!value->empty()) {
      SLUICE_ASSIGN_OR_RETURN(out.value,
                              ReadText(*x, "a descriptor value", kMaxDescriptorTextLength));
    }
  }
  if (const YamlAt* x = f->Find("rate_limit")) {
    out.rate_limit.emplace();
    SLUICE_RETURN_IF_ERROR(RateLimit(*x, *out.rate_limit));
  }
  if (const YamlAt* x = f->Find("shadow_mode")) {
    SLUICE_ASSIGN_OR_RETURN(out.shadow_mode, ReadBool(*x));
  }
  if (const YamlAt* x = f->Find("detailed_metric")) {
    SLUICE_ASSIGN_OR_RETURN(out.detailed_metric, ReadBool(*x));
  }
  if (const YamlAt* x = f->Find("share_threshold")) {
    SLUICE_ASSIGN_OR_RETURN(out.share_threshold, ReadBool(*x));
    // As in envoyproxy/ratelimit: sharing is of the values a wildcard matches.
    if (out.share_threshold && (!out.value || out.value->find('*') == std::string::npos)) {
      return Fail(*x, "share_threshold needs a wildcard value (one with `*`, such as `files*`)");
    }
  }
  if (const YamlAt* x = f->Find("descriptors")) {
    SLUICE_RETURN_IF_ERROR(Descriptors(*x, depth + 1, out.descriptors));
  }
  if (const YamlAt* x = f->Find("metadata")) {
    // It only feeds the dynamic metadata of an answer, which sluice does not
    // send: decisions are the same with or without it.
    warnings_.push_back(Locate(*x, "ignored: sluice sends no dynamic metadata"));
  }
  if (out.shadow_mode && !out.rate_limit) {
    // envoyproxy/ratelimit loads it too; it does nothing there.
    warnings_.push_back(
        Locate(*f->Find("shadow_mode"), "ignored: no rate_limit on this descriptor"));
    out.shadow_mode = false;
  }
  return absl::OkStatus();
}

absl::Status Reader::RateLimit(const YamlAt& v, EnvoyRateLimit& out) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, "a rate_limit (a map with unit and requests_per_unit)",
              {"unit", "requests_per_unit", "unit_multiplier", "unlimited", "name", "replaces",
               "algorithm", "rate", "limit", "period", "burst", "scope"},
              {{"mode",
                "leaky_bucket mode shape (Envoy cannot hold a request for its departure time; "
                "leaky_bucket here polices)"},
               {"max_delay", "shaping delays (Envoy cannot hold a request)"},
               {"queue", "shaping queues (Envoy cannot hold a request)"}});
  if (!f.ok()) return f.status();
  if (const YamlAt* x = f->Find("name")) {
    SLUICE_ASSIGN_OR_RETURN(out.name, ReadName(*x, internal::NameChars::kText));
  }
  if (const YamlAt* x = f->Find("replaces")) {
    absl::StatusOr<std::vector<YamlAt>> items = ReadList(*x, "{name: ...} maps");
    if (!items.ok()) return items.status();
    for (const YamlAt& item : *items) {
      absl::StatusOr<Fields> r = ReadMap(item, "a map {name: ...}", {"name"});
      if (!r.ok()) return r.status();
      const YamlAt* name = r->Find("name");
      if (name == nullptr) return Fail(r->Missing("name"), "required");
      SLUICE_ASSIGN_OR_RETURN(std::string replaced, ReadName(*name, internal::NameChars::kText));
      if (replaced == out.name) return Fail(*name, "a limit cannot replace itself");
      replaces_.emplace_back(*name, replaced);
      out.replaces.push_back(std::move(replaced));
    }
  }
  if (const YamlAt* x = f->Find("unlimited")) {
    SLUICE_ASSIGN_OR_RETURN(out.unlimited, ReadBool(*x));
  }
  if (out.unlimited) {
    // As envoyproxy/ratelimit: a unit is refused; its `replaces` apply.
    for (std::string_view key :
         {"unit", "unit_multiplier", "algorithm", "rate", "limit", "period", "burst", "scope"}) {
      if (const YamlAt* x = f->Find(key)) {
        return Fail(*x, Cat(key, " does not apply to an unlimited rate_limit (unlimited: true)"));
      }
    }
    if (const YamlAt* x = f->Find("requests_per_unit")) {
      // envoyproxy/ratelimit loads it too, and ignores it.
      warnings_.push_back(Locate(*x, "ignored: the rate_limit is unlimited"));
    }
    return absl::OkStatus();
  }

  const YamlAt* unit = f->Find("unit");
  const YamlAt* per_unit = f->Find("requests_per_unit");
  const YamlAt* rate = f->Find("rate");
  const YamlAt* limit = f->Find("limit");
  const YamlAt* period = f->Find("period");
  LimitOptions& options = out.limit.options;
  options.algorithm = Algorithm::kFixedWindow;  // what envoyproxy/ratelimit counts with
  const YamlAt* multiplier = f->Find("unit_multiplier");
  if (multiplier != nullptr && unit == nullptr) {
    return Fail(*multiplier, "applies to unit + requests_per_unit");
  }
  if ((unit != nullptr || per_unit != nullptr) &&
      (rate != nullptr || limit != nullptr || period != nullptr)) {
    const YamlAt* second = rate != nullptr ? rate : limit != nullptr ? limit : period;
    return Fail(*second, "set unit + requests_per_unit, or rate (or limit + period), not both");
  }
  if (unit != nullptr || per_unit != nullptr) {
    if (unit == nullptr) return Fail(f->Missing("unit"), "required with requests_per_unit");
    if (per_unit == nullptr) {
      // envoyproxy/ratelimit reads a missing number as 0, which denies every
      // request; that is too easy to do by accident to do silently.
      return Fail(f->Missing("requests_per_unit"),
                  "required with unit (0 denies every request; write it when that is meant)");
    }
    absl::StatusOr<std::string> name = ReadScalar(*unit, "a unit");
    if (!name.ok()) return name.status();
    static constexpr EnvoyUnit kUnits[] = {
        EnvoyUnit::kSecond, EnvoyUnit::kMinute, EnvoyUnit::kHour, EnvoyUnit::kDay,
        EnvoyUnit::kWeek,   EnvoyUnit::kMonth,  EnvoyUnit::kYear};
    const std::string lower = internal::AsciiLower(*name);
    for (EnvoyUnit u : kUnits) {
      if (lower == EnvoyUnitName(u)) out.unit = u;
    }
    if (out.unit == EnvoyUnit::kUnknown) {
      return Fail(*unit, Cat("unknown unit \"", *name,
                             "\" (expected one of: second, minute, hour, day, week, month, year)"));
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t n,
                            ReadInt(*per_unit, 0, std::numeric_limits<uint32_t>::max()));
    out.requests_per_unit = static_cast<uint32_t>(n);
    out.deny_all = n == 0;
    // unit_multiplier: N: one window of N units (as envoyproxy/ratelimit).
    int64_t times = 1;
    if (multiplier != nullptr) {
      // Bounded so that the window is at most kMaxPeriod (366 days).
      SLUICE_ASSIGN_OR_RETURN(
          times, ReadInt(*multiplier, 1, kMaxPeriod.micros() / EnvoyUnitLength(out.unit).micros()));
    }
    options.rate = Rate{.limit = n, .period = EnvoyUnitLength(out.unit) * times};
  } else if (rate != nullptr || limit != nullptr || period != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(options.rate, ReadLimitRate(*f));
    // Reported back to Envoy in Envoy's terms when the period is one of its units.
    out.requests_per_unit = static_cast<uint32_t>(
        std::min<int64_t>(options.rate.limit, std::numeric_limits<uint32_t>::max()));
    for (EnvoyUnit u : {EnvoyUnit::kSecond, EnvoyUnit::kMinute, EnvoyUnit::kHour, EnvoyUnit::kDay,
                        EnvoyUnit::kWeek, EnvoyUnit::kMonth, EnvoyUnit::kYear}) {
      if (EnvoyUnitLength(u) == options.rate.period) out.unit = u;
    }
  } else {
    return Fail(f->Missing("unit"), "required: unit + requests_per_unit, rate, or unlimited: true");
  }

  if (const YamlAt* x = f->Find("algorithm")) {
    SLUICE_ASSIGN_OR_RETURN(options.algorithm, ReadAlgorithm(*x));
    if (options.algorithm == Algorithm::kConcurrency) {
      // Envoy's ShouldRateLimit has no call that ends a request: a slot taken
      // there could only run out its lease (docs/concurrency.md).
      return Fail(*x,
                  "concurrency limits are not offered through Envoy's rate limit service (it "
                  "never says when a request ends, so a slot could not be released); limit "
                  "concurrency in sluice's gateway, or with Envoy's own circuit breakers");
    }
  }
  if (const YamlAt* x = f->Find("burst")) {
    SLUICE_ASSIGN_OR_RETURN(options.burst, ReadInt(*x, 1, internal::kMaxBurst));
  }
  SLUICE_ASSIGN_OR_RETURN(out.limit.scope, ReadScope(*f, {.shared_store = options_.shared_store}));
  if (out.deny_all) {
    for (std::string_view key : {"algorithm", "burst"}) {
      if (const YamlAt* x = f->Find(key)) {
        return Fail(
            *x, Cat(key, " does not apply with requests_per_unit: 0 (every request is denied)"));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<LimitConfig> made = MakeLimit(options);
  if (!made.ok()) return Fail(v, made.status());
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
      return Fail(at,
                  Cat("no rate_limit of domain \"", domain.domain, "\" is named \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EnvoyDomain> ParseDocument(std::string_view yaml, const std::string& source,
                                          EnvoyParseOptions options) {
  const Reader reader(source, options);
  absl::StatusOr<std::optional<YamlAt>> document =
      reader.ReadDocument(yaml, "an envoy rate limit file");
  if (!document.ok()) return document.status();
  if (!document->has_value()) {
    return reader.Fail({YAML::Node(), "", 1}, "empty: expected domain and descriptors");
  }
  return reader.Domain(**document);
}

}  // namespace

Duration EnvoyUnitLength(EnvoyUnit unit) {
  switch (unit) {
    case EnvoyUnit::kSecond:
      return Duration::Seconds(1);
    case EnvoyUnit::kMinute:
      return Duration::Minutes(1);
    case EnvoyUnit::kHour:
      return Duration::Hours(1);
    case EnvoyUnit::kDay:
      return Duration::Days(1);
    case EnvoyUnit::kWeek:
      return Duration::Days(7);
    case EnvoyUnit::kMonth:
      return Duration::Days(30);
    case EnvoyUnit::kYear:
      return Duration::Days(365);
    case EnvoyUnit::kUnknown:
      break;
  }
  return Duration::Zero();
}

std::string_view EnvoyUnitName(EnvoyUnit unit) {
  switch (unit) {
    case EnvoyUnit::kSecond:
      return "second";
    case EnvoyUnit::kMinute:
      return "minute";
    case EnvoyUnit::kHour:
      return "hour";
    case EnvoyUnit::kDay:
      return "day";
    case EnvoyUnit::kWeek:
      return "week";
    case EnvoyUnit::kMonth:
      return "month";
    case EnvoyUnit::kYear:
      return "year";
    case EnvoyUnit::kUnknown:
      break;
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

absl::StatusOr<std::shared_ptr<EnvoyConfig>> ReadEnvoySection(
    const std::string& source, const std::optional<YamlAt>& envoy,
    const std::optional<YamlAt>& envoy_files, const EnvoyParseOptions& options) {
  auto config = std::make_shared<EnvoyConfig>();
  Reader reader(source, options);
  // domain -> "file:line" of its first appearance, and its index
  std::map<std::string, std::pair<std::string, size_t>, std::less<>> seen;
  // With merge_domains: domain, key and value (or none) of each first-level
  // descriptor -> its "file:line".
  std::map<std::tuple<std::string, std::string, std::optional<std::string>>, std::string> merged;
  auto add = [&](EnvoyDomain domain, const YamlAt& at, const Reader& where) -> absl::Status {
    const std::string here = Cat(domain.source, ":", domain.line);
    auto [it, inserted] = seen.try_emplace(domain.domain, here, config->domains.size());
    if (options.merge_domains) {
      // As envoyproxy/ratelimit merges: the first level's descriptors join
      // the domain's; the same key and value met twice is an error there too.
      for (size_t i = 0; i < domain.descriptors.size(); ++i) {
        const EnvoyDescriptor& d = domain.descriptors[i];
        const std::string place = Cat(domain.source, ":", d.line);
        auto [first, added] = merged.try_emplace({domain.domain, d.key, d.value}, place);
        if (!added) {
          return where.Fail(
              {YAML::Node(), Cat("descriptors[", i, "]"), d.line},
              Cat("duplicate descriptor key \"", d.key, "\"",
                  d.value ? Cat(" value \"", *d.value, "\"") : std::string(" (any value)"),
                  " in domain \"", domain.domain, "\" (first at ", first->second, ")"));
        }
      }
    }
    if (!inserted) {
      if (!options.merge_domains) {
        return where.Fail(
            at, Cat("duplicate domain \"", domain.domain, "\" (first at ", it->second.first, ")"));
      }
      EnvoyDomain& into = config->domains[it->second.second];
      for (EnvoyDescriptor& d : domain.descriptors) into.descriptors.push_back(std::move(d));
      for (std::string& w : domain.warnings) into.warnings.push_back(std::move(w));
      return absl::OkStatus();
    }
    config->domains.push_back(std::move(domain));
    return absl::OkStatus();
  };
  if (envoy) {
    absl::StatusOr<std::vector<YamlAt>> items = reader.ReadList(*envoy, "domains (- domain: ...)");
    if (!items.ok()) return items.status();
    for (const YamlAt& at : *items) {
      absl::StatusOr<EnvoyDomain> domain = reader.Domain(at);
      if (!domain.ok()) return domain.status();
      const YamlAt domain_at{at.node, JoinPath(at.path, "domain"), domain->line};
      SLUICE_RETURN_IF_ERROR(add(*std::move(domain), domain_at, reader));
    }
  }
  if (envoy_files) {
    absl::StatusOr<std::vector<YamlAt>> items = reader.ReadList(*envoy_files, "file paths");
    if (!items.ok()) return items.status();
    for (const YamlAt& at : *items) {
      if (!at.node.IsScalar() || at.node.Scalar().empty()) {
        return reader.Fail(at, Cat("expected a file path, got ", DescribeNode(at.node)));
      }
      const std::string& given = at.node.Scalar();
      const std::string path = internal::PathBeside(source, given);
      absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
      if (!text.ok()) return reader.Fail(at, text.status());
      absl::StatusOr<EnvoyDomain> domain = ParseEnvoyDomain(*text, path, options);
      if (!domain.ok()) return domain.status();
      const Reader file_reader(path, options);
      const YamlAt domain_at{YAML::Node(), "domain", domain->line};
      SLUICE_RETURN_IF_ERROR(add(*std::move(domain), domain_at, file_reader));
    }
  }
  return config;
}

}  // namespace internal
}  // namespace sluice
