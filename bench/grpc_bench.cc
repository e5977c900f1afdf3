// sluice_grpc_bench: a load generator for the Envoy rate limit service.
//
// Keeps --concurrency ShouldRateLimit calls in flight (gRPC's callback client
// API: each finished call starts the next from its completion callback)
// over --channels HTTP/2 connections for --seconds, after --warmup seconds
// that are not counted, and prints calls per second, the answers (OK,
// OVER_LIMIT, errors) and latency percentiles. Each call carries one
// descriptor [{--key: <value>}] in --domain; the value is fixed with
// --keys 1, else uniformly random among --keys values.
//
//   sluice_grpc_bench --target 127.0.0.1:8081 --domain bench --key user --keys 100000
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <CLI/CLI.hpp>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using Clock = std::chrono::steady_clock;

// Latency histogram: buckets of 1/8 octave from 1 us (relative error < 9%),
// atomics so completion callbacks on any gRPC thread can record.
class Latency {
 public:
  void Record(int64_t us) {
    const int b = us <= 1 ? 0 : std::min<int>(kBuckets - 1, static_cast<int>(std::log2(us) * 8));
    buckets_[b].fetch_add(1, std::memory_order_relaxed);
  }
  int64_t Percentile(double p) const {
    int64_t total = 0;
    for (const auto& b : buckets_) total += b.load();
    const auto rank = static_cast<int64_t>(std::ceil(p * static_cast<double>(total)));
    int64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += buckets_[i].load();
      if (seen >= rank && seen > 0) return static_cast<int64_t>(std::exp2((i + 1) / 8.0));
    }
    return 0;
  }

 private:
  static constexpr int kBuckets = 8 * 30;  // up to ~18 minutes
  std::array<std::atomic<int64_t>, kBuckets> buckets_{};
};

struct Stats {
  std::atomic<int64_t> ok{0}, over{0}, errors{0};
  Latency latency;
};

struct Settings {
  std::string target = "127.0.0.1:8081";
  std::string domain = "bench";
  std::string key = "user";
  int64_t keys = 1;
  int concurrency = 64;
  int channels = 4;
  double seconds = 5;
  double warmup = 1;
};

// One in-flight slot: a call, and when it finishes, the next one.
class Slot {
 public:
  Slot(rls::RateLimitService::Stub* stub, const Settings& s, std::atomic<bool>& counting,
       std::atomic<bool>& stopping, Stats& stats, std::atomic<int>& live, uint64_t seed)
      : stub_(stub),
        settings_(s),
        counting_(counting),
        stopping_(stopping),
        stats_(stats),
        live_(live),
        rng_(seed) {}

  void Start() {
    request_.Clear();
    request_.set_domain(settings_.domain);
    auto* entry = request_.add_descriptors()->add_entries();
    entry->set_key(settings_.key);
    const int64_t n = settings_.keys <= 1
                          ? 0
                          : std::uniform_int_distribution<int64_t>(0, settings_.keys - 1)(rng_);
    entry->set_value("k" + std::to_string(n));
    response_.Clear();
    context_ = std::make_unique<grpc::ClientContext>();
    start_ = Clock::now();
    stub_->async()->ShouldRateLimit(context_.get(), &request_, &response_,
                                    [this](grpc::Status status) { Finished(status); });
  }

 private:
  void Finished(const grpc::Status& status) {
    if (counting_.load(std::memory_order_relaxed)) {
      const auto us =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_).count();
      stats_.latency.Record(us);
      if (!status.ok()) {
        stats_.errors.fetch_add(1, std::memory_order_relaxed);
      } else if (response_.overall_code() == rls::RateLimitResponse::OK) {
        stats_.ok.fetch_add(1, std::memory_order_relaxed);
      } else {
        stats_.over.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (stopping_.load(std::memory_order_relaxed)) {
      live_.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
    Start();
  }

  rls::RateLimitService::Stub* stub_;
  const Settings& settings_;
  std::atomic<bool>& counting_;
  std::atomic<bool>& stopping_;
  Stats& stats_;
  std::atomic<int>& live_;
  std::mt19937_64 rng_;
  rls::RateLimitRequest request_;
  rls::RateLimitResponse response_;
  std::unique_ptr<grpc::ClientContext> context_;
  Clock::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"Load generator for sluice's Envoy rate limit service (ShouldRateLimit)"};
  app.add_option("--target", s.target, "host:port of the gRPC listener");
  app.add_option("--domain", s.domain, "the request's domain");
  app.add_option("--key", s.key, "the descriptor entry's key");
  app.add_option("--keys", s.keys, "distinct entry values (1: always the same)")
      ->check(CLI::PositiveNumber);
  app.add_option("--concurrency", s.concurrency, "calls in flight")->check(CLI::Range(1, 100000));
  app.add_option("--channels", s.channels, "HTTP/2 connections")->check(CLI::Range(1, 1000));
  app.add_option("--seconds", s.seconds, "measured duration")->check(CLI::Range(0.1, 3600.0));
  app.add_option("--warmup", s.warmup, "unmeasured lead-in, seconds")
      ->check(CLI::Range(0.0, 600.0));
  CLI11_PARSE(app, argc, argv);

  std::vector<std::unique_ptr<rls::RateLimitService::Stub>> stubs;
  for (int c = 0; c < s.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("sluice.bench.channel", c);  // a distinct argument: a connection of its own
    stubs.push_back(rls::RateLimitService::NewStub(
        grpc::CreateCustomChannel(s.target, grpc::InsecureChannelCredentials(), args)));
  }
  std::atomic<bool> counting{false}, stopping{false};
  std::atomic<int> live{s.concurrency};
  Stats stats;
  std::vector<std::unique_ptr<Slot>> slots;
  for (int i = 0; i < s.concurrency; ++i) {
    slots.push_back(std::make_unique<Slot>(stubs[static_cast<size_t>(i % s.channels)].get(), s,
                                           counting, stopping, stats, live, 1000 + i));
  }
  for (auto& slot : slots) slot->Start();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.warmup));
  counting = true;
  const auto begin = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
  counting = false;
  const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
  stopping = true;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (live.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (live.load() > 0) {
    std::fprintf(stderr, "sluice_grpc_bench: %d calls still in flight after 30 s\n", live.load());
    return 1;
  }
  const int64_t calls = stats.ok + stats.over + stats.errors;
  std::printf(
      "calls_per_s=%.0f calls=%lld ok=%lld over_limit=%lld errors=%lld p50_us=%lld "
      "p99_us=%lld p999_us=%lld concurrency=%d channels=%d keys=%lld seconds=%.1f\n",
      static_cast<double>(calls) / elapsed, static_cast<long long>(calls),
      static_cast<long long>(stats.ok.load()), static_cast<long long>(stats.over.load()),
      static_cast<long long>(stats.errors.load()),
      static_cast<long long>(stats.latency.Percentile(0.5)),
      static_cast<long long>(stats.latency.Percentile(0.99)),
      static_cast<long long>(stats.latency.Percentile(0.999)), s.concurrency, s.channels,
      static_cast<long long>(s.keys), elapsed);
  return stats.errors > 0 ? 1 : 0;
}
