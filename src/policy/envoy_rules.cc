#include "policy/envoy_rules.h"

#include <algorithm>
#include <utility>

#include "base/cat.h"

namespace sluice::policy {
namespace {

using internal::Cat;

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

bool NeedsEscape(char c) { return c == '|' || c == '=' || c == '\\'; }

void AppendEscapedPart(std::string& out, std::string_view part) {
  for (char c : part) {
    if (NeedsEscape(c)) out.push_back('\\');
    out.push_back(c);
  }
}

size_t EscapedLength(std::string_view part) {
  return part.size() + static_cast<size_t>(std::count_if(part.begin(), part.end(), NeedsEscape));
}

// Values in the config never hold control characters (the reader refuses
// them), so this marks "any value" in a rule's id without ambiguity.
constexpr std::string_view kAnyValue = "\x01";

absl::StatusOr<std::shared_ptr<Limiter>> MakeLimiter(const std::string& name, const LimitSpec& spec,
                                                     const RuleOptions& options) {
  LimiterOptions lo;
  lo.name = name;
  lo.clock = options.clock;
  lo.limits.push_back(spec.options);
  if (spec.scope == Scope::kGlobal && options.shared != nullptr)
    lo.stores.push_back(options.shared);
  absl::StatusOr<std::unique_ptr<Limiter>> limiter = Limiter::Create(*options.local, std::move(lo));
  if (!limiter.ok()) return limiter.status();
  return std::shared_ptr<Limiter>(*std::move(limiter));
}

// The policy a rule decides with: `limiter` null when it admits nothing.
void Finish(Rule& rule, std::shared_ptr<Limiter> limiter, std::string name, bool shadow,
            metrics::Metrics& metrics) {
  PolicyConfig config;
  config.name = std::move(name);
  config.shadow = shadow;
  config.limits = {rule.spec};  // a deny-all rule's window is its unit (times unit_multiplier)
  rule.policy = Policy(std::move(config), std::move(limiter),
                       Policy::CountersFor(metrics, rule.stats_key, Policy::kShadowDenied),
                       /*store_errors=*/nullptr);
}

}  // namespace

std::string StateKey(std::string_view domain, std::span<const Entry> entries) {
  std::string key;
  key.reserve(StateKeyLength(domain, entries));
  AppendEscapedPart(key, domain);
  for (const Entry& e : entries) {
    key.push_back('|');
    AppendEscapedPart(key, e.key);
    key.push_back('=');
    AppendEscapedPart(key, e.value);
  }
  return key;
}

size_t StateKeyLength(std::string_view domain, std::span<const Entry> entries) {
  size_t n = EscapedLength(domain);
  for (const Entry& e : entries) n += 2 + EscapedLength(e.key) + EscapedLength(e.value);
  return n;
}

// Greedy, with one point to come back to: the last `*` seen takes one more
// character each time what follows it fails. Time O(|pattern| x |value|) at
// worst; the pattern comes from the config, the value from the request.
bool DomainRules::WildcardMatch(std::string_view pattern, std::string_view value) {
  size_t p = 0, v = 0;
  size_t star = std::string_view::npos, resume = 0;
  while (v < value.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = v;
    } else if (p < pattern.size() && pattern[p] == value[v]) {
      ++p;
      ++v;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      v = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const Rule* DomainRules::Match(std::span<Entry> entries) const {
  const Level* level = &root_;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    auto key = level->keys.find(Absl(e.key));
    if (key == level->keys.end()) return nullptr;
    const Level::Key& k = key->second;
    const Node* next = nullptr;
    if (auto v = k.by_value.find(Absl(e.value)); v != k.by_value.end()) next = v->second.get();
    for (size_t w = 0; next == nullptr && w < k.wildcards.size(); ++w) {
      if (!WildcardMatch(k.wildcards[w].first, e.value)) continue;
      next = k.wildcards[w].second.get();
      if (next->share_threshold) e.value = k.wildcards[w].first;
    }
    if (next == nullptr) next = k.any.get();
    if (next == nullptr) return nullptr;
    if (i + 1 == entries.size()) return next->rule;
    level = &next->children;
  }
  return nullptr;
}

absl::StatusOr<const Rule*> Overrides::Get(uint32_t requests_per_unit, EnvoyUnit unit) {
  const Duration length = EnvoyUnitLength(unit);
  if (length <= Duration::Zero()) return absl::InvalidArgumentError("limit.unit: unknown unit");
  const uint64_t id = (uint64_t{requests_per_unit} << 8) | static_cast<uint64_t>(unit);
  std::lock_guard lock(mu_);
  if (auto it = rules_.find(id); it != rules_.end()) return it->second.get();
  if (rules_.size() >= kMaxOverrides) {
    return absl::ResourceExhaustedError(
        Cat("more than ", kMaxOverrides, " distinct limit overrides; this one is refused"));
  }
  auto rule = std::make_unique<Rule>();
  rule->id = Cat("override/", requests_per_unit, "/", EnvoyUnitName(unit));
  rule->stats_key = Cat("override_", requests_per_unit, "_per_", EnvoyUnitName(unit));
  rule->unit = unit;
  rule->requests_per_unit = requests_per_unit;
  rule->spec.options.algorithm = Algorithm::kFixedWindow;
  rule->spec.options.rate = {.limit = requests_per_unit, .period = length};
  rule->spec.scope = options_.shared != nullptr ? Scope::kGlobal : Scope::kLocal;
  std::shared_ptr<Limiter> limiter;
  if (requests_per_unit == 0) {
    rule->kind = Rule::Kind::kDenyAll;
  } else {
    absl::StatusOr<std::shared_ptr<Limiter>> made =
        MakeLimiter(Cat("envoy/", rule->id), rule->spec, options_);
    if (!made.ok()) return made.status();
    limiter = *std::move(made);
  }
  Finish(*rule, std::move(limiter), rule->stats_key, /*shadow=*/false, *options_.metrics);
  return rules_.emplace(id, std::move(rule)).first->second.get();
}

absl::StatusOr<std::shared_ptr<const RuleSet>> RuleSet::Create(const EnvoyConfig* config,
                                                               const RuleOptions& options,
                                                               const RuleSet* previous) {
  auto set = std::make_shared<RuleSet>();
  if (config == nullptr) return std::shared_ptr<const RuleSet>(std::move(set));

  // Walks one level of the config tree into `level`; `id` and `stats` are
  // the parent's.
  auto build = [&](auto& self, const std::string& domain, const std::vector<EnvoyDescriptor>& from,
                   DomainRules::Level& level, const std::string& id,
                   const std::string& stats) -> absl::Status {
    for (const EnvoyDescriptor& d : from) {
      std::string node_id = id;
      node_id.push_back('|');
      AppendEscapedPart(node_id, d.key);
      node_id.push_back('=');
      if (d.value)
        AppendEscapedPart(node_id, *d.value);
      else
        node_id += kAnyValue;
      const std::string node_stats = Cat(stats, ".", d.key, d.value ? Cat("_", *d.value) : "");

      auto node = std::make_unique<DomainRules::Node>();
      if (d.rate_limit) {
        const EnvoyRateLimit& rl = *d.rate_limit;
        auto rule = std::make_unique<Rule>();
        rule->id = node_id;
        rule->stats_key = node_stats;
        rule->limit_name = rl.name;
        rule->replaces = rl.replaces;
        rule->unit = rl.unit;
        rule->requests_per_unit = rl.requests_per_unit;
        rule->spec = rl.limit;
        rule->kind = rl.unlimited  ? Rule::Kind::kUnlimited
                     : rl.deny_all ? Rule::Kind::kDenyAll
                                   : Rule::Kind::kLimited;
        std::shared_ptr<Limiter> limiter;
        if (rule->kind == Rule::Kind::kLimited) {
          const Rule* before = nullptr;
          if (previous != nullptr) {
            auto it = previous->by_id_.find(node_id);
            if (it != previous->by_id_.end()) before = it->second;
          }
          if (before != nullptr && before->kind == Rule::Kind::kLimited &&
              before->spec == rule->spec) {
            limiter =
                before->policy.shared_limiter();  // same place, same limit: keep the keys' state
          } else {
            absl::StatusOr<std::shared_ptr<Limiter>> made =
                MakeLimiter(Cat("envoy/", node_stats), rule->spec, options);
            if (!made.ok()) {
              return absl::InvalidArgumentError(Cat("envoy domain \"", domain, "\": ", node_stats,
                                                    ": ", made.status().message()));
            }
            limiter = *std::move(made);
          }
        }
        Finish(*rule, std::move(limiter), rl.name.empty() ? node_stats : rl.name,
               d.shadow_mode || options.shadow, *options.metrics);
        node->rule = rule.get();
        set->by_id_[node_id] = rule.get();
        set->rules_.push_back(std::move(rule));
      }
      if (absl::Status s = self(self, domain, d.descriptors, node->children, node_id, node_stats);
          !s.ok()) {
        return s;
      }
      node->share_threshold = d.share_threshold;
      DomainRules::Level::Key& key = level.keys[d.key];
      if (!d.value) {
        key.any = std::move(node);
      } else if (d.value->find('*') != std::string::npos) {
        key.wildcards.emplace_back(*d.value, std::move(node));
      } else {
        key.by_value[*d.value] = std::move(node);
      }
    }
    return absl::OkStatus();
  };

  for (const EnvoyDomain& domain : config->domains) {
    auto rules = std::make_unique<DomainRules>();
    rules->domain_ = domain.domain;
    std::string id;
    AppendEscapedPart(id, domain.domain);
    if (absl::Status s =
            build(build, domain.domain, domain.descriptors, rules->root_, id, domain.domain);
        !s.ok()) {
      return s;
    }
    set->domains_[domain.domain] = std::move(rules);
  }
  return std::shared_ptr<const RuleSet>(std::move(set));
}

const DomainRules* RuleSet::Find(std::string_view domain) const {
  auto it = domains_.find(Absl(domain));
  return it == domains_.end() ? nullptr : it->second.get();
}

}  // namespace sluice::policy
