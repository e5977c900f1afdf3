// PolicySet: the policies of one config, ready to decide. Internal to the
// server.
//
// Built from a Config once per load; immutable afterwards, so a reload swaps
// in a whole new set while requests in flight finish on the old one. A
// policy whose limits did not change keeps its Limiter (and so the state of
// its keys) across the swap.
//
// Thread-safety: all const methods from any thread.
#ifndef SLUICE_POLICY_POLICY_SET_H_
#define SLUICE_POLICY_POLICY_SET_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "metrics/top_keys.h"
#include "policy/headers.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/limiter.h"
#include "sluice/store/store.h"

namespace sluice::policy {

using metrics::Counter;
using metrics::Metrics;

// The parts of a request that matching and keys read.
struct RequestFacts {
  std::string_view method;
  std::string_view path;  // without the query, NormalizePath'd
  // The path as sent, before NormalizePath (an upstream may read it
  // otherwise: PlainPath); empty: `path` stands for it.
  std::string_view raw_path;
  std::string_view query;  // without its '?'; empty when none
  std::string_view host;   // Host header, without port, lower case
  std::string_view peer_ip;
  // The subject of the certificate the client presented and the listener
  // verified (mutual TLS), RFC 2253; empty when none.
  std::string_view client_cert;
  // Header value by lower-case name (its first line); nullopt when absent.
  std::function<std::optional<std::string_view>(std::string_view)> header;
  // Every line of a header, in order. Optional: when unset, `header`'s one
  // line stands for all of them.
  std::function<std::vector<std::string_view>(std::string_view)> header_lines;
  // A header's value when it came in exactly one line; nullopt when absent
  // or sent more than once. Optional: when unset, `header` stands for it.
  std::function<std::optional<std::string_view>(std::string_view)> header_once;
  // Every line of a header under any name a CGI-style server reads as its
  // (`X_Api_Key` is `X-Api-Key` to them: HTTP_X_API_KEY), in order; what a
  // policy's match reads. Optional: when unset, `header_lines` (or
  // `header`) stands for it. Never the client's address, whose one header
  // is read exactly (a proxy checks no other spelling).
  std::function<std::vector<std::string_view>(std::string_view)> cgi_lines;
  // The methods a POST's body names in a `_method` field, once the gateway
  // has read it (PolicySet::MayCountByBodyMethod); empty otherwise.
  std::span<const std::string> body_methods;
};

bool Matches(const MatchConfig& match, const RequestFacts& request);

// Whether `peer_ip` is in one of `trusted_proxies`.
bool FromTrustedProxy(std::string_view peer_ip, const std::vector<Cidr>& trusted_proxies);

// The client's address: the peer, or, when the peer is a trusted proxy, the
// right-most address in `real_ip_header` (lower case; "forwarded" is read as
// RFC 7239's for=) that is not itself a trusted proxy. Only that one header
// is read, so a client cannot pick its address by sending another one.
std::string ClientIp(const RequestFacts& request, const std::vector<Cidr>& trusted_proxies,
                     std::string_view real_ip_header);

// The client as the `client_ip` key part counts it: the network of
// `prefix`'s length that `ip` is in ("2001:db8:1:2::/64", "198.51.100.0/24"),
// or the address itself at a full length (ClientIpPrefix).
std::string CountedClient(std::string ip, const ClientIpPrefix& prefix);

class Policy {
 public:
  // kAllowed: admitted at once; kDelayed: admitted after a shaping delay.
  enum Outcome { kAllowed, kDenied, kShadowDenied, kDelayed, kMissingKey, kOutcomes };
  using Counters = std::array<Counter*, kOutcomes>;

  Policy() = default;
  // A policy built outside a PolicySet (an Envoy rule compiles into one).
  // `limiter` null: the policy admits nothing (a limit of zero per
  // config.limits[0]'s period). Null counters count nothing.
  Policy(PolicyConfig config, std::shared_ptr<Limiter> limiter, Counters counters,
         Counter* store_errors)
      : config_(std::move(config)),
        sf_name_(SfString(config_.name)),
        limiter_(std::move(limiter)),
        counters_(counters),
        store_errors_(store_errors),
        shapes_(limiter_ != nullptr &&
                std::any_of(limiter_->limits().begin(), limiter_->limits().end(), IsShape)),
        holds_slots_(limiter_ != nullptr && std::any_of(limiter_->limits().begin(),
                                                        limiter_->limits().end(), IsConcurrency)) {}
  // sluice_decisions_total{policy=label, outcome} for the outcomes up to
  // `last` (the others stay null).
  static Counters CountersFor(Metrics& metrics, const std::string& label, Outcome last);

  const PolicyConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  // The name as the RateLimit fields write it (an sf-string), quoted once.
  const std::string& sf_name() const { return sf_name_; }
  bool shadow() const { return config_.shadow; }
  // False for a policy that admits nothing; limiter() is then not to be called.
  bool has_limiter() const { return limiter_ != nullptr; }
  Limiter& limiter() const { return *limiter_; }
  const std::shared_ptr<Limiter>& shared_limiter() const { return limiter_; }
  // Whether deciding answers at once (no limit in a remote store).
  bool in_process() const { return limiter_ == nullptr || limiter_->in_process(); }
  // Whether some limit shapes (delays) requests: such a policy decides last,
  // since its departure slot is not given back.
  bool shapes() const { return shapes_; }
  // Whether some limit is a concurrency limit: an admitted request holds
  // slots until it is done.
  bool holds_slots() const { return holds_slots_; }

  // The key for a gateway request: the parts joined by '|' ('|' and '\' in a
  // part are escaped with '\'). nullopt when a part is missing and the
  // policy says deny.
  std::optional<std::string> KeyFor(const RequestFacts& request, std::string_view route,
                                    const std::vector<Cidr>& trusted_proxies,
                                    std::string_view real_ip_header) const;

  // The period of limit `index`.
  Duration Period(size_t index) const;
  // The period (seconds, rounded up) of limit `index`, for RateLimit-Policy w=.
  int64_t WindowSeconds(size_t index) const;
  // The Retry-After jitter for a denial by limit `index`: on_deny's, else
  // the default for its period (a concurrency limit: for its hold estimate).
  Duration JitterFor(size_t index) const;
  // Whether limit `index` is a concurrency limit.
  bool Concurrent(size_t index) const;

  // How long this policy's requests hold concurrency slots (HoldAverage,
  // sluice/algorithm/concurrency.h), from the holds Release ended: a
  // concurrency denial's Retry-After is at most this. Shared by the copies
  // of a policy; thread-safe.
  void ObserveHold(Duration hold) const;
  Duration HoldEstimate() const;
  Duration HoldCap(Duration retry_after) const { return holds_->Cap(retry_after); }

  // sluice_decisions_total{policy, outcome}, resolved once per load so the
  // hot path is one atomic add.
  void Count(Outcome outcome) const {
    if (counters_[outcome] != nullptr) counters_[outcome]->Add();
  }
  // What Count counted, for the admin listener's per-second series.
  int64_t Counted(Outcome outcome) const {
    return counters_[outcome] != nullptr ? counters_[outcome]->value() : 0;
  }
  // A denial (or shadow denial) of `key`: counted in top_keys().
  void CountDenial(std::string_view key, Time now) const {
    if (top_keys_ != nullptr) top_keys_->Add(key, now);
  }
  // The keys this policy denied most lately (a PolicySet's policies; kept
  // across reloads by name), or null.
  const metrics::TopKeys* top_keys() const { return top_keys_.get(); }
  // sluice_store_errors_total{policy}: decisions on_store_error made.
  void CountStoreError() const {
    if (store_errors_ != nullptr) store_errors_->Add();
  }

 private:
  friend class PolicySet;
  PolicyConfig config_;
  std::string sf_name_;
  std::shared_ptr<Limiter> limiter_;
  Counters counters_{};
  Counter* store_errors_ = nullptr;
  std::shared_ptr<metrics::TopKeys> top_keys_;
  bool shapes_ = false;
  bool holds_slots_ = false;
  std::shared_ptr<HoldAverage> holds_ = std::make_shared<HoldAverage>();
};

// The methods the `_method` parameters of a query, or of a form body of
// the same syntax, name (the first and the last few).
absl::InlinedVector<std::string, 2> QueryMethods(std::string_view query);

// The methods the `_method` fields of a POST's form body name, read as
// Rack (Rails) and PHP (Laravel, Symfony) read a form: with no media type
// (no Content-Type, or an empty one: Rack parses it as a form) or
// application/x-www-form-urlencoded, its parameters (QueryMethods); multipart (RFC 7578), each part
// whose Content-Disposition `name` is `_method` as PHP reads a name; else none. `content_type` is
// the field's value, nullopt when absent. The first and the last few.
absl::InlinedVector<std::string, 2> FormMethods(std::optional<std::string_view> content_type,
                                                std::string_view body);

// The policies that apply to a request (few: kept inline).
using PolicyList = absl::InlinedVector<const Policy*, 4>;

class PolicySet {
 public:
  // `store` holds local limits; `shared` (may be null: none configured)
  // global ones. `previous` (may be null): policies with the same name,
  // limits and on_store_error keep their Limiter, hence their keys' state.
  static absl::StatusOr<std::shared_ptr<const PolicySet>> Create(const Config& config, Store& store,
                                                                 Store* shared, const Clock& clock,
                                                                 const PolicySet* previous,
                                                                 Metrics& metrics);

  const Config& config() const { return config_; }
  const Policy* Find(std::string_view name) const;
  const std::vector<Policy>& policies() const { return policies_; }
  // Policies whose `match` applies to this gateway request, in config order.
  PolicyList Matching(const RequestFacts& request) const;
  // The first route whose match applies; null when none.
  const RouteConfig* RouteFor(const RequestFacts& request) const;
  // Whether `request` is a POST that a policy of another method would count
  // if its body named that method (`_method`, MethodMatches): a policy's
  // match but for its method applies. The gateway then reads the body
  // before it decides (its RequestFacts::body_methods); else it need not.
  bool MayCountByBodyMethod(const RequestFacts& request) const;
  // The largest request body the main listener may take: server.max_body_bytes,
  // or a route's larger routes[].max_body_bytes.
  int64_t largest_body_bytes() const { return largest_body_bytes_; }

 private:
  Config config_;
  int64_t largest_body_bytes_ = 0;
  std::vector<Policy> policies_;
  // The matches of the policies of a method other than POST, without it.
  std::vector<MatchConfig> other_methods_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_POLICY_SET_H_
