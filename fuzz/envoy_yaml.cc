// Fuzz target: an envoyproxy/ratelimit rules file (sluice::ParseEnvoyDomain),
// then what the Envoy rate limit service builds from it: the rules tree
// (policy::RuleSet, built twice: the second time as a reload that keeps every
// rule's limiter) and a match of each path from the root down the first
// child of every descriptor. Every wildcard value of the file is also
// matched against every value of the file (DomainRules::WildcardMatch), and
// the answer checked against a plain dynamic-programming matcher.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/metrics.h"
#include "policy/envoy_rules.h"
#include "sluice/clock.h"
#include "sluice/envoy_config.h"
#include "sluice/store/memory_store.h"

namespace {

using sluice::EnvoyDescriptor;
using sluice::policy::Entry;

// Walks from `d` down its first children, matching the entries so far at
// every level.
void MatchDown(const sluice::policy::DomainRules& rules, const EnvoyDescriptor& d,
               std::vector<Entry>& entries) {
  const std::string& value = d.value ? *d.value : d.key;  // a value for an "any value" node
  entries.push_back({d.key, value});
  (void)rules.Match(entries);
  (void)sluice::policy::StateKey(rules.domain(), entries);
  if (!d.descriptors.empty()) MatchDown(rules, d.descriptors.front(), entries);
}

// Whether `value` matches `pattern` ('*': any run of characters), by the
// table of which prefixes match which: slow, and plainly right.
bool ReferenceMatch(std::string_view pattern, std::string_view value) {
  std::vector<char> row(value.size() + 1, 0), next(value.size() + 1);
  row[0] = 1;
  for (const char p : pattern) {
    next[0] = p == '*' && row[0];
    for (size_t j = 1; j <= value.size(); ++j) {
      next[j] = p == '*' ? (row[j] || next[j - 1]) : (row[j - 1] && p == value[j - 1]);
    }
    row.swap(next);
  }
  return row[value.size()];
}

void CollectValues(const std::vector<EnvoyDescriptor>& descriptors,
                   std::vector<std::string_view>& values) {
  for (const EnvoyDescriptor& d : descriptors) {
    if (d.value) values.push_back(*d.value);
    CollectValues(d.descriptors, values);
  }
}

// Each wildcard value against each value (and a few of their variants),
// the first kMaxValues of them, at most kMaxLength bytes each: the
// reference costs their product.
void CheckWildcards(const std::vector<EnvoyDescriptor>& descriptors) {
  constexpr size_t kMaxValues = 16;
  constexpr size_t kMaxLength = 256;
  std::vector<std::string_view> values;
  CollectValues(descriptors, values);
  if (values.size() > kMaxValues) values.resize(kMaxValues);
  for (std::string_view pattern : values) {
    if (pattern.size() > kMaxLength || pattern.find('*') == std::string_view::npos) continue;
    for (std::string_view value : values) {
      if (value.size() > kMaxLength) continue;
      for (std::string_view v :
           {value, value.substr(0, value.size() / 2), value.substr(value.size() / 2)}) {
        if (sluice::policy::DomainRules::WildcardMatch(pattern, v) != ReferenceMatch(pattern, v)) {
          __builtin_trap();
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sluice::EnvoyDomain> domain = sluice::ParseEnvoyDomain(text, "fuzz.yaml");
  if (!domain.ok()) return 0;

  // Fresh state for every input: the metrics are named after the rules.
  static const sluice::ManualClock clock;
  sluice::MemoryStore store({.max_keys = 1024});
  sluice::metrics::Metrics metrics;
  const sluice::policy::RuleOptions options{.local = &store, .clock = &clock, .metrics = &metrics};
  sluice::EnvoyConfig config;
  config.domains.push_back(*std::move(domain));
  auto first = sluice::policy::RuleSet::Create(&config, options, nullptr);
  if (!first.ok()) return 0;
  auto reload = sluice::policy::RuleSet::Create(&config, options, first->get());
  if (!reload.ok()) __builtin_trap();  // the same rules built once already
  const sluice::policy::DomainRules* rules = (*reload)->Find(config.domains[0].domain);
  if (rules == nullptr) __builtin_trap();
  for (const EnvoyDescriptor& d : config.domains[0].descriptors) {
    std::vector<Entry> entries;
    MatchDown(*rules, d, entries);
  }
  CheckWildcards(config.domains[0].descriptors);
  return 0;
}
