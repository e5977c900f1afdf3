// RlqsService: Envoy's rate limit quota service (RLQS v3,
// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`),
// served beside ShouldRateLimit on grpc.listen when the config has `rlqs:`
// (docs/envoy.md, "Quota service"). Each Envoy holds one bidirectional
// stream: it reports per bucket what it allowed and denied; the service
// splits each bucket's limit among the Envoys reporting it (QuotaBook) and
// pushes assignments, on every report and whenever shares change.
//
// A stream whose first report names no domain, or a later one another
// domain, or that reports a malformed bucket, is ended with
// INVALID_ARGUMENT and the reason; one that names more buckets than
// rlqs.max_buckets_per_stream, with RESOURCE_EXHAUSTED.
//
// Includes the gRPC and protobuf headers: only rls_server.cc and the tests
// include it. Thread-safety: gRPC's threads and the service's own ticker
// (every 100 ms) meet under one mutex.
#ifndef SLUICE_ENVOY_RLQS_SERVICE_H_
#define SLUICE_ENVOY_RLQS_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "envoy/quota_book.h"
#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"
#include "metrics/metrics.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/store.h"

namespace sluice::envoy {

// The book's options from the config's `rlqs:`.
QuotaOptions ToQuotaOptions(const RlqsConfig& config);

// One report of `stream` into `book`: the domain checked against the
// stream's (`domain`, empty before its first report, set by it), then each
// bucket's usage. InvalidArgument or ResourceExhausted (QuotaBook::Report)
// say why the stream must end. The service's handling, without gRPC (the
// fuzz target calls it too).
absl::Status ApplyReports(
    QuotaBook& book, uint64_t stream, std::string& domain,
    const ::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports& reports, Time now);

class RlqsService final
    : public ::envoy::service::rate_limit_quota::v3::RateLimitQuotaService::CallbackService {
 public:
  // `clock` and `metrics` must outlive the service; so must `fleet`, a
  // shared store (Redis) through which several instances share each
  // bucket's limit (Store::ClaimQuota), or null for one instance alone.
  RlqsService(const RlqsConfig& config, const Clock& clock, metrics::Metrics& metrics,
              Store* fleet = nullptr);
  // Stops the ticker and waits for the claims in flight. The gRPC server
  // must be gone first.
  ~RlqsService() override;

  grpc::ServerBidiReactor<::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
                          ::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse>*
  StreamRateLimitQuotas(grpc::CallbackServerContext* context) override;

  // The rules of a reloaded config (QuotaBook::Reconfigure): the buckets
  // and their shares are kept.
  void Reconfigure(const RlqsConfig& config);

  // The book's view, for tests and metrics.
  std::vector<QuotaBook::BucketView> Buckets() const;
  int64_t streams() const;

  class Stream;

 private:
  friend class Stream;
  // Recomputes the shares and writes what changed. `mu_` not held.
  void Dispatch();
  // The per-rule gauges, from the book (the ticker's, every 100 ms: not
  // on every report). `mu_` not held.
  void UpdateGauges();
  void Closed(uint64_t id);
  // Fleet mode: asks the store for the claims due.
  void Claim();

  const Clock& clock_;
  metrics::Metrics& metrics_;
  mutable std::mutex mu_;
  QuotaBook book_;
  std::map<uint64_t, Stream*> streams_;
  uint64_t next_id_ = 1;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;
  std::thread ticker_;
  // Per configured rule (bounded by the config, not by what Envoys send):
  // the gauges and the values they were last set to.
  struct RuleGauges {
    metrics::Counter* envoys = nullptr;
    metrics::Counter* assigned = nullptr;
    int64_t envoys_now = 0;
    int64_t assigned_now = 0;
  };
  std::map<std::pair<std::string, std::string>, RuleGauges> rule_gauges_;
  // Fleet mode.
  Store* fleet_ = nullptr;
  std::string instance_;  // this instance's name in the store's claims
  std::atomic<int64_t> claim_ttl_us_;
  std::mutex claims_mu_;
  std::condition_variable claims_cv_;
  int claims_in_flight_ = 0;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_RLQS_SERVICE_H_
