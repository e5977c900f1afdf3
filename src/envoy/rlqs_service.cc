#include "envoy/rlqs_service.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <random>
#include <utility>

#include "base/cat.h"

namespace sluice::envoy {

namespace {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;
namespace type = ::envoy::type::v3;
using Reports = rlqs::RateLimitQuotaUsageReports;
using Response = rlqs::RateLimitQuotaResponse;
using internal::Cat;

QuotaLimit ToLimit(const RlqsLimitConfig& c) {
  return {.rate = c.rate,
          .burst = c.burst,
          .strategy = c.requests_per_time_unit ? QuotaStrategy::kRequestsPerTimeUnit
                                               : QuotaStrategy::kTokenBucket};
}

void SetDuration(Duration d, google::protobuf::Duration* out) {
  out->set_seconds(d.micros() / 1'000'000);
  out->set_nanos(static_cast<int32_t>(d.micros() % 1'000'000 * 1000));
}

type::RateLimitUnit UnitOf(Duration unit) {
  if (unit == Duration::Minutes(1)) return type::MINUTE;
  if (unit == Duration::Hours(1)) return type::HOUR;
  if (unit == Duration::Days(1)) return type::DAY;
  return type::SECOND;
}

void Fill(const QuotaBook::Send& s, Response::BucketAction& out) {
  auto& id = *out.mutable_bucket_id()->mutable_bucket();
  for (const auto& [key, value] : s.bucket) id[key] = value;
  const QuotaAction& a = s.action;
  if (a.kind == QuotaAction::Kind::kAbandon) {
    out.mutable_abandon_action();
    return;
  }
  auto* assignment = out.mutable_quota_assignment_action();
  SetDuration(a.ttl, assignment->mutable_assignment_time_to_live());
  type::RateLimitStrategy& strategy = *assignment->mutable_rate_limit_strategy();
  switch (a.kind) {
    case QuotaAction::Kind::kAllowAll:
      strategy.set_blanket_rule(type::RateLimitStrategy::ALLOW_ALL);
      return;
    case QuotaAction::Kind::kDenyAll:
      strategy.set_blanket_rule(type::RateLimitStrategy::DENY_ALL);
      return;
    case QuotaAction::Kind::kShare:
      break;
    case QuotaAction::Kind::kAbandon:
      return;
  }
  if (a.strategy == QuotaStrategy::kTokenBucket) {
    type::TokenBucket& bucket = *strategy.mutable_token_bucket();
    bucket.set_max_tokens(a.max_tokens);
    bucket.mutable_tokens_per_fill()->set_value(a.tokens_per_fill);
    SetDuration(a.fill_interval, bucket.mutable_fill_interval());
  } else {
    auto& per_unit = *strategy.mutable_requests_per_time_unit();
    per_unit.set_requests_per_time_unit(a.requests_per_unit);
    per_unit.set_time_unit(UnitOf(a.unit));
  }
}

}  // namespace

absl::Status ApplyReports(QuotaBook& book, uint64_t stream, std::string& domain,
                          const Reports& reports, Time now) {
  if (domain.empty()) {
    if (reports.domain().empty()) {
      return absl::InvalidArgumentError("the first report of a stream must name its domain");
    }
    // Only a configured domain is kept (and named in metrics): the book
    // refuses others below, before anything is counted.
    domain = reports.domain();
  } else if (!reports.domain().empty() && reports.domain() != domain) {
    return absl::InvalidArgumentError(
        Cat("a stream's domain cannot change (it is \"", domain, "\"); open another stream"));
  }
  if (!book.HasDomain(domain)) {
    const std::string shown = domain.substr(0, 256);
    domain.clear();
    return absl::InvalidArgumentError(Cat("unknown domain \"", shown, "\""));
  }
  for (const Reports::BucketQuotaUsage& u : reports.bucket_quota_usages()) {
    const google::protobuf::Duration& e = u.time_elapsed();
    if (e.seconds() < 0 || e.seconds() > 3600 || e.nanos() < 0 || e.nanos() > 999'999'999) {
      return absl::InvalidArgumentError("time_elapsed must be between 0 and 1h");
    }
    const Duration elapsed = Duration::Micros(e.seconds() * 1'000'000 + e.nanos() / 1000);
    BucketKey key(u.bucket_id().bucket().begin(), u.bucket_id().bucket().end());
    absl::Status s = book.Report(stream, domain, std::move(key), elapsed, u.num_requests_allowed(),
                                 u.num_requests_denied(), now);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

QuotaOptions ToQuotaOptions(const RlqsConfig& config) {
  QuotaOptions o;
  o.ttl = config.assignment_ttl;
  o.abandon_after = config.abandon_after;
  o.max_buckets_per_stream = config.max_buckets_per_stream;
  for (const RlqsDomainConfig& d : config.domains) {
    QuotaDomain domain{.domain = d.domain};
    for (const RlqsBucketConfig& b : d.buckets) {
      domain.rules.push_back({.match = b.match, .limit = ToLimit(b.limit)});
    }
    domain.unknown = d.unknown == RlqsUnknown::kAllowAll ? UnknownBucket::kAllowAll
                     : d.unknown == RlqsUnknown::kLimit  ? UnknownBucket::kLimit
                                                         : UnknownBucket::kDenyAll;
    domain.unknown_limit = ToLimit(d.unknown_limit);
    o.domains.push_back(std::move(domain));
  }
  return o;
}

// One Envoy's stream. Reads reports one at a time; writes what the service
// pushes, one at a time, in order. Ends with the first bad report.
class RlqsService::Stream final : public grpc::ServerBidiReactor<Reports, Response> {
 public:
  Stream(RlqsService& service, uint64_t id) : service_(service), id_(id) {}

  void Begin() { StartRead(&report_); }

  // From any thread, under the service's mutex (the stream is alive then).
  void Push(Response response) {
    std::lock_guard lock(mu_);
    if (ending_) return;
    pending_.push_back(std::move(response));
    if (!writing_) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // Envoy closed its side, or the call is gone
      End(grpc::Status::OK);
      return;
    }
    if (grpc::Status s = Take(report_); !s.ok()) {
      End(s);
      return;
    }
    service_.Dispatch();
    StartRead(&report_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mu_);
    pending_.pop_front();
    if (!ok) pending_.clear();
    if (!pending_.empty()) {
      StartWrite(&pending_.front());
      return;
    }
    writing_ = false;
    if (ending_ && !finished_) {
      finished_ = true;
      lock.unlock();
      Finish(final_);
    }
  }

  void OnDone() override {
    service_.Closed(id_);
    delete this;
  }

 private:
  grpc::Status Take(const Reports& r) {
    const Time now = service_.clock_.Now();
    std::lock_guard lock(service_.mu_);
    absl::Status s = ApplyReports(service_.book_, id_, domain_, r, now);
    if (!s.ok()) {
      return grpc::Status(s.code() == absl::StatusCode::kResourceExhausted
                              ? grpc::StatusCode::RESOURCE_EXHAUSTED
                              : grpc::StatusCode::INVALID_ARGUMENT,
                          std::string(s.message()));
    }
    if (allowed_ == nullptr) {
      allowed_ = service_.metrics_.Get("sluice_rlqs_reported_requests_total",
                                       {{"domain", domain_}, {"outcome", "allowed"}});
      denied_ = service_.metrics_.Get("sluice_rlqs_reported_requests_total",
                                      {{"domain", domain_}, {"outcome", "denied"}});
    }
    for (const Reports::BucketQuotaUsage& u : r.bucket_quota_usages()) {
      allowed_->Add(static_cast<int64_t>(u.num_requests_allowed()));
      denied_->Add(static_cast<int64_t>(u.num_requests_denied()));
    }
    return grpc::Status::OK;
  }

  void End(const grpc::Status& status) {
    if (!status.ok()) {
      service_.metrics_.Get("sluice_rlqs_streams_refused_total", {})->Add();
    }
    std::unique_lock lock(mu_);
    if (ending_) return;
    ending_ = true;
    final_ = status;
    if (!writing_) {
      finished_ = true;
      lock.unlock();
      Finish(status);
    }
  }

  RlqsService& service_;
  const uint64_t id_;
  Reports report_;
  std::string domain_;
  metrics::Counter* allowed_ = nullptr;  // once the domain is known
  metrics::Counter* denied_ = nullptr;
  std::mutex mu_;  // the writes
  std::deque<Response> pending_;
  bool writing_ = false;
  bool ending_ = false;
  bool finished_ = false;
  grpc::Status final_;
};

namespace {

QuotaOptions FleetOptions(const RlqsConfig& config, bool fleet) {
  QuotaOptions o = ToQuotaOptions(config);
  o.fleet = fleet;
  return o;
}

// A bucket's name in the store: the domain and the sorted entries.
std::string BucketName(const std::string& domain, const BucketKey& bucket) {
  std::string out = domain;
  for (const auto& [key, value] : bucket) {
    out.push_back('\x1f');
    out += key;
    out.push_back('=');
    out += value;
  }
  return out;
}

// Requests per second in the store's integers (micro-requests per second),
// rounded down, or up (a floor must not shrink).
int64_t MicroRate(double per_second, bool up = false) {
  const double micro = std::clamp(per_second, 0.0, 1e9) * 1e6;
  return static_cast<int64_t>(up ? std::ceil(micro) : std::floor(micro));
}

std::string InstanceName() {
  std::random_device random;
  char name[24];
  std::snprintf(name, sizeof name, "%08x%08x", random(), random());
  return name;
}

}  // namespace

RlqsService::RlqsService(const RlqsConfig& config, const Clock& clock, metrics::Metrics& metrics,
                         Store* fleet)
    : clock_(clock),
      metrics_(metrics),
      book_(FleetOptions(config, fleet != nullptr)),
      fleet_(fleet),
      // A claim outlasts the last assignment it backs (the TTL and the
      // delivery margin) by the renewals' slack.
      claim_ttl_us_((config.assignment_ttl + Duration::Seconds(4)).micros()) {
  if (fleet_ != nullptr) instance_ = InstanceName();
  // At 0 from the start rather than at their first event (an alert on
  // their rate has a series to read).
  metrics_.Get("sluice_rlqs_streams", {});
  metrics_.Get("sluice_rlqs_streams_refused_total", {});
  if (fleet_ != nullptr) {
    for (const char* result : {"ok", "error"}) {
      metrics_.Get("sluice_rlqs_claims_total", {{"result", result}});
    }
  }
  metrics_.SetHelp("sluice_rlqs_streams", "Envoy quota streams (RLQS) open now.");
  metrics_.SetHelp("sluice_rlqs_reported_requests_total",
                   "Requests Envoys reported to the quota service, by domain and outcome.");
  metrics_.SetHelp("sluice_rlqs_assignments_total", "Bucket assignments sent to Envoys.");
  metrics_.SetHelp("sluice_rlqs_envoys",
                   "Envoy streams reporting the buckets of a quota rule, summed over its buckets.");
  metrics_.SetHelp("sluice_rlqs_assigned_per_second",
                   "Requests per second assigned to Envoys in the buckets of a quota rule.");
  metrics_.SetHelp("sluice_rlqs_streams_refused_total",
                   "Quota streams ended for a bad report (INVALID_ARGUMENT, RESOURCE_EXHAUSTED).");
  metrics_.SetHelp("sluice_rlqs_claims_total",
                   "Claims of bucket limits asked of Redis across instances, by result.");
  for (const char* gauge :
       {"sluice_rlqs_streams", "sluice_rlqs_envoys", "sluice_rlqs_assigned_per_second"}) {
    metrics_.SetType(gauge, "gauge");
  }
  // Assignments are renewed, and shares freed by passed ones handed out,
  // without waiting for a report.
  ticker_ = std::thread([this] {
    std::unique_lock lock(tick_mu_);
    while (!tick_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; })) {
      lock.unlock();
      Claim();
      Dispatch();
      UpdateGauges();
      lock.lock();
    }
  });
}

RlqsService::~RlqsService() {
  {
    std::lock_guard lock(tick_mu_);
    stopping_ = true;
  }
  tick_cv_.notify_all();
  ticker_.join();
  std::unique_lock lock(claims_mu_);
  claims_cv_.wait(lock, [this] { return claims_in_flight_ == 0; });
}

void RlqsService::Claim() {
  if (fleet_ == nullptr) return;
  std::vector<QuotaBook::ClaimNeed> needs;
  Time sent;
  {
    std::lock_guard lock(mu_);
    sent = clock_.Now();
    needs = book_.ClaimNeeds(sent);
  }
  const Duration claim_ttl = Duration::Micros(claim_ttl_us_.load());
  for (QuotaBook::ClaimNeed& need : needs) {
    {
      std::lock_guard lock(claims_mu_);
      ++claims_in_flight_;
    }
    const std::string name = BucketName(need.domain, need.bucket);
    fleet_->ClaimQuota(
        name, instance_, MicroRate(need.want), MicroRate(need.floor, /*up=*/true),
        MicroRate(need.limit), claim_ttl,
        [this, need = std::move(need), sent, claim_ttl](absl::StatusOr<Store::QuotaClaim> claim) {
          {
            std::lock_guard lock(mu_);
            if (claim.ok()) {
              // Good until its time in the store, counted from when it was
              // asked (no later than the store's now), with room for the
              // clocks' rates (0.1%).
              const Duration ttl = claim_ttl - Duration::Micros(claim_ttl.micros() / 1000);
              book_.SetClaim(need.domain, need.bucket, static_cast<double>(claim->claim) / 1e6,
                             static_cast<double>(claim->target) / 1e6, sent + ttl);
            } else {
              book_.ClaimFailed(need.domain, need.bucket);
            }
          }
          metrics_.Get("sluice_rlqs_claims_total", {{"result", claim.ok() ? "ok" : "error"}})
              ->Add();
          Dispatch();
          std::lock_guard lock(claims_mu_);
          if (--claims_in_flight_ == 0) claims_cv_.notify_all();
        });
  }
}

grpc::ServerBidiReactor<Reports, Response>* RlqsService::StreamRateLimitQuotas(
    grpc::CallbackServerContext* /*context*/) {
  Stream* stream = nullptr;
  {
    std::lock_guard lock(mu_);
    const uint64_t id = next_id_++;
    stream = new Stream(*this, id);
    streams_[id] = stream;
  }
  metrics_.Get("sluice_rlqs_streams", {})->Add(1);
  stream->Begin();
  return stream;
}

void RlqsService::UpdateGauges() {
  std::lock_guard lock(mu_);
  const Time now = clock_.Now();
  // The per-rule gauges: Envoys reporting its buckets, their assignments
  // summed (requests per second, rounded down).
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> totals;
  for (auto& [key, g] : rule_gauges_) totals[key];  // a rule with nothing left goes to 0
  for (const QuotaBook::BucketView& v : book_.Buckets(now)) {
    auto& [envoys, assigned] = totals[{v.domain, v.rule}];
    envoys += v.streams;
    assigned += v.assigned;
  }
  for (const auto& [key, t] : totals) {
    RuleGauges& g = rule_gauges_[key];
    if (g.envoys == nullptr) {
      g.envoys = metrics_.Get("sluice_rlqs_envoys", {{"domain", key.first}, {"rule", key.second}});
      g.assigned = metrics_.Get("sluice_rlqs_assigned_per_second",
                                {{"domain", key.first}, {"rule", key.second}});
    }
    const auto assigned = static_cast<int64_t>(std::floor(t.second));
    g.envoys->Add(t.first - g.envoys_now);
    g.assigned->Add(assigned - g.assigned_now);
    g.envoys_now = t.first;
    g.assigned_now = assigned;
  }
}

void RlqsService::Dispatch() {
  std::lock_guard lock(mu_);
  const std::vector<QuotaBook::Send> sends = book_.Rebalance(clock_.Now());
  if (sends.empty()) return;
  std::map<uint64_t, Response> out;
  for (const QuotaBook::Send& s : sends) Fill(s, *out[s.stream].add_bucket_action());
  for (auto& [id, response] : out) {
    auto it = streams_.find(id);
    if (it == streams_.end()) continue;
    metrics_.Get("sluice_rlqs_assignments_total", {})->Add(response.bucket_action_size());
    it->second->Push(std::move(response));
  }
}

void RlqsService::Closed(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    streams_.erase(id);
    book_.Close(id, clock_.Now());
  }
  metrics_.Get("sluice_rlqs_streams", {})->Add(-1);
}

void RlqsService::Reconfigure(const RlqsConfig& config) {
  {
    std::lock_guard lock(mu_);
    book_.Reconfigure(ToQuotaOptions(config));
  }
  claim_ttl_us_ = (config.assignment_ttl + Duration::Seconds(4)).micros();
  Dispatch();
}

std::vector<QuotaBook::BucketView> RlqsService::Buckets() const {
  std::lock_guard lock(mu_);
  return book_.Buckets(clock_.Now());
}

int64_t RlqsService::streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(streams_.size());
}

}  // namespace sluice::envoy
