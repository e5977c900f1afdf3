// Test support for the quota service (RLQS): Envoys played over real gRPC
// streams. Each reports its demand on bucket {name: api} of domain "web"
// every 100 ms (half allowed, half denied) and keeps the rate of the token
// bucket it was last assigned.
#ifndef SLUICE_ENVOY_RLQS_TEST_SUPPORT_H_
#define SLUICE_ENVOY_RLQS_TEST_SUPPORT_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "envoy/service/rate_limit_quota/v3/rlqs.grpc.pb.h"

namespace sluice::envoy::rlqs_test {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;

// A report of `requests` over `elapsed_ms` on {name: api}; the first of a
// stream names the domain.
inline rlqs::RateLimitQuotaUsageReports ApiUsage(bool first, int64_t elapsed_ms,
                                                 uint64_t requests) {
  rlqs::RateLimitQuotaUsageReports r;
  if (first) r.set_domain("web");
  auto* u = r.add_bucket_quota_usages();
  (*u->mutable_bucket_id()->mutable_bucket())["name"] = "api";
  u->mutable_time_elapsed()->set_seconds(elapsed_ms / 1000);
  u->mutable_time_elapsed()->set_nanos(static_cast<int32_t>(elapsed_ms % 1000 * 1'000'000));
  u->set_num_requests_allowed(requests / 2);
  u->set_num_requests_denied(requests - requests / 2);
  return r;
}

// The requests per second a token bucket assignment allows (0 otherwise).
inline double AssignedRate(const rlqs::RateLimitQuotaResponse::BucketAction& a) {
  if (!a.has_quota_assignment_action()) return -1;  // not an assignment
  const auto& s = a.quota_assignment_action().rate_limit_strategy();
  if (!s.has_token_bucket()) return 0;  // a blanket rule: deny all here
  const auto& b = s.token_bucket();
  return b.tokens_per_fill().value() /
         (static_cast<double>(b.fill_interval().seconds()) + b.fill_interval().nanos() / 1e9);
}

struct PlayedEnvoy {
  rlqs::RateLimitQuotaService::Stub* stub = nullptr;
  double demand = 0;  // requests per second
};

struct PlayResult {
  std::vector<double> latest;  // each Envoy's last assigned rate
  double worst_sum = 0;        // the most the latest ones ever summed to
  bool converged = false;
};

// Plays `envoys` until `converged(latest rates)` holds or `within` passes;
// `then` runs while the streams are still open.
inline PlayResult PlayEnvoys(const std::vector<PlayedEnvoy>& envoys,
                             const std::function<bool(const std::vector<double>&)>& converged,
                             std::chrono::seconds within, const std::function<void()>& then = {}) {
  std::mutex mu;
  PlayResult result;
  result.latest.assign(envoys.size(), 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (size_t e = 0; e < envoys.size(); ++e) {
    threads.emplace_back([&, e] {
      grpc::ClientContext context;
      auto stream = envoys[e].stub->StreamRateLimitQuotas(&context);
      std::thread reader([&] {
        rlqs::RateLimitQuotaResponse r;
        while (stream->Read(&r)) {
          for (const auto& a : r.bucket_action()) {
            const double rate = AssignedRate(a);
            if (rate < 0) continue;
            std::lock_guard lock(mu);
            result.latest[e] = rate;
            double sum = 0;
            for (double x : result.latest) sum += x;
            result.worst_sum = std::max(result.worst_sum, sum);
          }
        }
      });
      EXPECT_TRUE(stream->Write(ApiUsage(true, 0, 0)));
      while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!stream->Write(ApiUsage(false, 100, static_cast<uint64_t>(envoys[e].demand / 10)))) {
          break;
        }
      }
      stream->WritesDone();
      reader.join();
      EXPECT_TRUE(stream->Finish().ok());
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard lock(mu);
    if (converged(result.latest)) {
      result.converged = true;
      break;
    }
  }
  if (then) then();
  stop = true;
  for (std::thread& t : threads) t.join();
  return result;
}

}  // namespace sluice::envoy::rlqs_test

#endif  // SLUICE_ENVOY_RLQS_TEST_SUPPORT_H_
