// Fuzz target: an envoyproxy/ratelimit rules file (sluice::ParseEnvoyDomain),
// then what the Envoy rate limit service builds from it: the rules tree
// (envoy::RuleSet, built twice: the second time as a reload that keeps every
// rule's limiter) and a match of each path from the root down the first
// child of every descriptor.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "envoy/rules.h"
#include "server/metrics.h"
#include "sluice/clock.h"
#include "sluice/envoy_config.h"
#include "sluice/store/memory_store.h"

namespace {

using sluice::EnvoyDescriptor;
using sluice::envoy::Entry;

// Walks from `d` down its first children, matching the entries so far at
// every level.
void MatchDown(const sluice::envoy::DomainRules& rules, const EnvoyDescriptor& d,
               std::vector<Entry>& entries) {
  const std::string& value = d.value ? *d.value : d.key;  // a value for an "any value" node
  entries.push_back({d.key, value});
  (void)rules.Match(entries);
  (void)sluice::envoy::StateKey(rules.domain(), entries);
  if (!d.descriptors.empty()) MatchDown(rules, d.descriptors.front(), entries);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sluice::EnvoyDomain> domain = sluice::ParseEnvoyDomain(text, "fuzz.yaml");
  if (!domain.ok()) return 0;

  // Fresh state for every input: the metrics are named after the rules.
  static const sluice::ManualClock clock;
  sluice::MemoryStore store({.max_keys = 1024});
  sluice::server::Metrics metrics;
  const sluice::envoy::RuleOptions options{.local = &store, .clock = &clock, .metrics = &metrics};
  sluice::EnvoyConfig config;
  config.domains.push_back(*std::move(domain));
  auto first = sluice::envoy::RuleSet::Create(&config, options, nullptr);
  if (!first.ok()) return 0;
  auto reload = sluice::envoy::RuleSet::Create(&config, options, first->get());
  if (!reload.ok()) __builtin_trap();  // the same rules built once already
  const sluice::envoy::DomainRules* rules = (*reload)->Find(config.domains[0].domain);
  if (rules == nullptr) __builtin_trap();
  for (const EnvoyDescriptor& d : config.domains[0].descriptors) {
    std::vector<Entry> entries;
    MatchDown(*rules, d, entries);
  }
  return 0;
}
