// QuotaBook: the apportioning behind Envoy's rate limit quota service
// (RLQS, docs/envoy.md "Quota service"). Many Envoys report how many
// requests each bucket saw; the book splits each bucket's limit among the
// Envoys (streams) reporting it, max-min fair by what they report, and says
// what to send to whom. Free of gRPC: the service (rlqs_service.cc) reads
// the streams and writes the actions; the tests drive the book directly.
//
// The one guarantee: for every bucket, the rates the Envoys may be
// enforcing at any moment sum to at most the limit. An Envoy enforces an
// assignment from when it gets it until a newer one arrives or its TTL
// passes; so a share taken from one Envoy is given to another only once the
// larger assignment it replaces can no longer be in force (its TTL and a
// margin after it was sent), and a stream that ends frees its share the
// same way. Growth comes from what is free; shrinking is at once.
//
// Thread-safety: none; the service holds one mutex around it.
//
//   QuotaBook book({.rule = ...});
//   book.Report(stream, "web", {{"name", "api"}}, Duration::Seconds(1), 90, 10, now);
//   for (const QuotaBook::Send& s : book.Rebalance(now)) ... write s.action to s.stream
#ifndef SLUICE_ENVOY_QUOTA_BOOK_H_
#define SLUICE_ENVOY_QUOTA_BOOK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "sluice/rate.h"
#include "sluice/time.h"

namespace sluice::envoy {

// A bucket id's entries, sorted by key (the order Envoy sends them in does
// not matter).
using BucketKey = std::vector<std::pair<std::string, std::string>>;

// What the strategy pushed to an Envoy is.
enum class QuotaStrategy { kTokenBucket, kRequestsPerTimeUnit };

// The limit of the buckets one rule matches, each bucket on its own.
struct QuotaLimit {
  Rate rate;
  int64_t burst = 0;  // 0: the rate's limit
  QuotaStrategy strategy = QuotaStrategy::kTokenBucket;
};

// What a bucket that no rule matches gets.
enum class UnknownBucket { kAllowAll, kDenyAll, kLimit };

struct QuotaRule {
  // Every entry must be in the bucket id with this value ("*": any value);
  // entries of the id beyond these are allowed.
  BucketKey match;
  QuotaLimit limit;
};

struct QuotaDomain {
  std::string domain;
  std::vector<QuotaRule> rules;  // the first that matches
  UnknownBucket unknown = UnknownBucket::kDenyAll;
  QuotaLimit unknown_limit;  // UnknownBucket::kLimit
};

struct QuotaOptions {
  std::vector<QuotaDomain> domains;
  // Sent with every assignment: Envoy applies its expired_assignment_behavior
  // when it passes without a newer one.
  Duration ttl = Duration::Seconds(10);
  // Added to a replaced assignment's TTL before its rate counts as free:
  // the time it may take to reach Envoy.
  Duration delivery_margin = Duration::Seconds(1);
  // A stream's bucket not reported for this long is abandoned.
  Duration abandon_after = Duration::Seconds(60);
  // Buckets one stream may hold; a report naming more is refused.
  int64_t max_buckets_per_stream = 1000;
  // Several instances share each limit (a shared store): a bucket's limit
  // here is the part of it this instance has claimed (SetClaim), and only
  // while the claim outlasts any assignment sent now (its TTL and the
  // margin); before the first claim, nothing.
  bool fleet = false;
};

// What to send one stream about one bucket.
struct QuotaAction {
  enum class Kind { kAllowAll, kDenyAll, kShare, kAbandon };
  Kind kind = Kind::kAllowAll;
  // kShare: requests per second, and the strategy's numbers for it.
  double rate = 0;
  QuotaStrategy strategy = QuotaStrategy::kTokenBucket;
  uint32_t max_tokens = 0;  // token bucket
  uint32_t tokens_per_fill = 0;
  Duration fill_interval;          // rounded up: never faster than `rate`
  uint64_t requests_per_unit = 0;  // requests per time unit
  Duration unit;                   // 1 s, 1 min, 1 h or 1 day
  Duration ttl;                    // not kAbandon
};

class QuotaBook {
 public:
  using StreamId = uint64_t;

  struct Send {
    StreamId stream = 0;
    std::string domain;
    BucketKey bucket;
    QuotaAction action;
  };

  // The share of each bucket, for metrics and tests.
  struct BucketView {
    std::string domain;
    BucketKey bucket;
    std::string rule;  // the rule's match ("client=*,name=api"), or "unknown"
    double limit = 0;  // requests per second
    int streams = 0;
    double assigned = 0;   // the latest assignments' rates, summed
    double committed = 0;  // what may be in force, summed (<= limit)
    uint64_t allowed = 0;  // reported, all time
    uint64_t denied = 0;
  };

  explicit QuotaBook(QuotaOptions options);

  // One bucket's usage from `stream` of `domain`: requests allowed and denied
  // over `elapsed` (0 in a watch, the first report). InvalidArgument for an
  // empty bucket id or key, an elapsed below 0 or above an hour, or counts
  // above 2^48; ResourceExhausted past max_buckets_per_stream.
  absl::Status Report(StreamId stream, const std::string& domain, BucketKey bucket,
                      Duration elapsed, uint64_t allowed, uint64_t denied, Time now);

  // The stream ended: its shares are freed once its assignments have passed.
  void Close(StreamId stream, Time now);

  // Recomputes the shares of the buckets reported or changed since the
  // last call (and of all, every `ttl / 2`, to renew assignments before
  // they pass and free what passed), and abandons buckets not reported for
  // abandon_after. Returns what to send, in order.
  std::vector<Send> Rebalance(Time now);

  std::vector<BucketView> Buckets(Time now) const;

  // Fleet mode: the buckets whose claim to renew now (every second; every
  // 100 ms while they want more than they hold or hold more than their
  // Envoys may use), each marked as asked until SetClaim or ClaimFailed.
  // Rates in requests per second: `want` the Envoys' demand (the limit for
  // an Envoy that reported none yet), at most the limit; `floor` what they
  // may be enforcing (a claim never goes below it).
  struct ClaimNeed {
    std::string domain;
    BucketKey bucket;
    double want = 0;
    double floor = 0;
    double limit = 0;
  };
  std::vector<ClaimNeed> ClaimNeeds(Time now);
  // The claim granted, good until `valid_until` (this clock), and the fair
  // share the Envoys are shrunk to when the claim is above it.
  void SetClaim(const std::string& domain, const BucketKey& bucket, double rate, double target,
                Time valid_until);
  void ClaimFailed(const std::string& domain, const BucketKey& bucket);

  bool HasDomain(const std::string& domain) const;

  // New rules (a reload), the buckets' state kept: each bucket takes its
  // rule in `options` (its shares shrink at once to a lower limit, the
  // assignments in force follow within a TTL); a domain no longer there
  // has its buckets abandoned. `fleet` stays as it was.
  void Reconfigure(QuotaOptions options);

  // The action a bucket would get by its rule alone (the unknown-bucket
  // policy included), without shares: kShare of the whole limit, or a
  // blanket rule. nullopt when the domain is not configured.
  std::optional<QuotaAction> RuleAction(const std::string& domain, const BucketKey& bucket) const;

  // The strategy's numbers for `rate` requests per second of `limit`.
  static QuotaAction ShareAction(const QuotaLimit& limit, double rate, Duration ttl);

 private:
  // One stream's part in one bucket.
  struct Member {
    double demand = -1;   // requests per second reported; -1: none yet
    double assigned = 0;  // the latest assignment's rate
    bool sent = false;
    bool resend = false;
    Time sent_at;
    // Larger assignments it replaced that may still be in force: until
    // their TTL and the delivery margin have passed.
    struct Older {
      double rate = 0;
      Time until;
    };
    std::vector<Older> older;
    Time last_report;
    bool closed = false;  // the stream ended: nothing is sent, nothing wanted
  };
  struct Bucket {
    std::optional<QuotaLimit> limit;  // unset: a blanket rule
    std::string rule;                 // BucketView::rule
    QuotaAction::Kind blanket = QuotaAction::Kind::kAllowAll;
    double rule_rate = 0;  // the configured limit, requests per second
    double rate = 0;       // the limit here: the rule's, or (fleet) the claim's
    // Fleet mode.
    double claim = 0;
    double claim_target = 0;
    Time claim_until;
    Time claim_asked;
    bool claim_in_flight = false;
    double claim_floor = 0;  // the floor sent with the claim in flight
    std::map<StreamId, Member> members;
    bool dirty = false;
    uint64_t allowed = 0;
    uint64_t denied = 0;
  };

  // Sets `b`'s rule, limit and blanket action from the options.
  void Resolve(const std::string& domain, const BucketKey& bucket, Bucket& b) const;
  // What `m` may be enforcing now.
  double Committed(const Member& m, Time now) const;
  // The limit `b` may be shared out to at `now`.
  double RateNow(const Bucket& b, Time now) const;
  void RebalanceBucket(const std::string& domain, const BucketKey& key, Bucket& b, Time now,
                       bool renew_all, std::vector<Send>& out);

  QuotaOptions options_;
  std::map<std::pair<std::string, BucketKey>, Bucket> buckets_;
  std::map<StreamId, int64_t> stream_buckets_;  // buckets per stream
  Time last_renewal_;
  Time last_fleet_pass_;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_QUOTA_BOOK_H_
