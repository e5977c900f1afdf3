// RuleSet: the envoy rules of one config (sluice/envoy_config.h), compiled
// into policies and ready to match request descriptors. Internal; the Envoy
// rate limit service (src/envoy/) matches with it and decides with
// Evaluate (policy/evaluation.h), like every other front end.
//
// Matching follows envoyproxy/ratelimit: a request descriptor's entries are
// walked level by level through the domain's descriptor tree; at each level
// an entry takes the node with its key and value, else the first wildcard
// node, in file order, whose pattern the value matches (a `*` anywhere in a
// value stands for any run of characters, none included: `foo*`, `*.com`,
// `foo*bar*baz`), else the node with its key and no value. The rule applies only when its node is
// reached by the last entry (a 2-entry descriptor never matches a 1-level rule) and the walk does
// not fall back: a more specific node without a limit hides a less specific one with a limit, as in
// envoyproxy/ratelimit.
//
// Each rate_limit becomes one Policy (named for the RateLimit fields, with
// one Limiter, none when it admits nothing); the state key is the domain and the
// request's whole entry list, so distinct values get distinct state (but
// the values a `share_threshold` wildcard matched, which share one). Like
// PolicySet, a RuleSet is immutable once built; a rebuild for a reload
// keeps the Limiter (and so the state) of every rule whose place in the
// tree and whose limit did not change.
//
// Thread-safety: const methods from any thread.
//
//   auto rules = RuleSet::Create(config.envoy.get(), {.local = &store, ...}, nullptr);
//   const DomainRules* d = (*rules)->Find("edge");
//   const Rule* rule = d ? d->Match(entries) : nullptr;   // null: no limit
#ifndef SLUICE_POLICY_ENVOY_RULES_H_
#define SLUICE_POLICY_ENVOY_RULES_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "policy/policy_set.h"
#include "sluice/clock.h"
#include "sluice/envoy_config.h"
#include "sluice/limiter.h"
#include "sluice/store/store.h"

namespace sluice::policy {

struct Rule {
  enum class Kind { kLimited, kUnlimited, kDenyAll };
  Kind kind = Kind::kLimited;
  // Identity across reloads: the domain and the (key, value) path to the node.
  std::string id;
  // envoyproxy/ratelimit's stats key ("edge.remote_address",
  // "edge.service_api.user"): the `policy` label of sluice_decisions_total.
  std::string stats_key;
  // rate_limit.name; "" when unnamed. What `replaces` refers to.
  std::string limit_name;
  std::vector<std::string> replaces;
  EnvoyUnit unit = EnvoyUnit::kUnknown;  // DescriptorStatus.current_limit
  uint32_t requests_per_unit = 0;
  LimitSpec spec;
  // What decides: named for RateLimit-Policy / RateLimit (limit_name, else
  // stats_key), shadow_mode, the limiter (none for kDenyAll: it admits
  // nothing; kUnlimited never decides).
  Policy policy;
};

struct Entry {
  std::string_view key;
  std::string_view value;
};

struct RuleOptions {
  Store* local = nullptr;   // required: the store of local limits
  Store* shared = nullptr;  // the store of `scope: global` limits, when configured
  const Clock* clock = nullptr;
  metrics::Metrics* metrics = nullptr;
  // Every rule in shadow mode (EnvoyConfig::shadow_mode).
  bool shadow = false;
};

class DomainRules {
 public:
  // The rule for a request descriptor's entries; null when none applies.
  // An entry that took a wildcard node with `share_threshold` has its value
  // replaced by the node's pattern, so that every value the pattern matches
  // has one state key (StateKey), as envoyproxy/ratelimit keys its cache.
  const Rule* Match(std::span<Entry> entries) const;
  // Whether `value` matches `pattern`, where each `*` stands for any run of
  // characters (none included) and every other character for itself.
  static bool WildcardMatch(std::string_view pattern, std::string_view value);
  const std::string& domain() const { return domain_; }

 private:
  friend class RuleSet;
  struct Node;
  struct Level {
    // key -> its nodes at this level
    struct Key {
      absl::flat_hash_map<std::string, std::unique_ptr<Node>> by_value;
      std::vector<std::pair<std::string, std::unique_ptr<Node>>> wildcards;  // pattern, node
      std::unique_ptr<Node> any;
    };
    absl::flat_hash_map<std::string, Key> keys;
  };
  struct Node {
    const Rule* rule = nullptr;
    bool share_threshold = false;  // a wildcard node whose values share one state
    Level children;
  };
  std::string domain_;
  Level root_;
};

// The limit a request descriptor's `limit` field asks for, shared by every
// domain and kept across reloads. At most kMaxOverrides distinct
// (requests_per_unit, unit) pairs: each is a Limiter, and requests choose
// them.
class Overrides {
 public:
  static constexpr size_t kMaxOverrides = 256;
  explicit Overrides(RuleOptions options) : options_(options) {}
  // Errors: ResourceExhausted beyond kMaxOverrides; InvalidArgument for an
  // unknown unit.
  absl::StatusOr<const Rule*> Get(uint32_t requests_per_unit, EnvoyUnit unit);

 private:
  RuleOptions options_;
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Rule>> rules_;
};

class RuleSet {
 public:
  // `config` may be null (no envoy rules). `previous` (may be null): rules
  // with the same id and limit keep their Limiter.
  static absl::StatusOr<std::shared_ptr<const RuleSet>> Create(const EnvoyConfig* config,
                                                               const RuleOptions& options,
                                                               const RuleSet* previous);

  // Null when the domain is not configured.
  const DomainRules* Find(std::string_view domain) const;

 private:
  std::vector<std::unique_ptr<Rule>> rules_;
  absl::flat_hash_map<std::string, std::unique_ptr<DomainRules>> domains_;
  absl::flat_hash_map<std::string, const Rule*> by_id_;
};

// The state key of a descriptor: the domain and every entry, each part
// escaped so that no two entry lists give the same key.
std::string StateKey(std::string_view domain, std::span<const Entry> entries);
// Its length, without building it (to refuse an over-long key up front).
size_t StateKeyLength(std::string_view domain, std::span<const Entry> entries);

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_ENVOY_RULES_H_
