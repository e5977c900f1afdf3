// sluice_bench_redis: decisions per second of the Redis store, through
// Limiter::AcquireAsync, at a fixed number of decisions in flight.
//
// One Limiter with one limit in Redis (policy "bench"). `--depth` lanes each
// keep one decision in flight: a lane's completion (on the store's I/O
// thread) starts its next decision, so exactly D are outstanding, pipelined
// by the store on its one connection. After `--seconds` the lanes stop and
// drain. Keys are "user-<12 digits>", uniform among `--keys` (the spelling
// redis-benchmark's __rand_int__ produces, so both send keys of one length).
//
// Calls per decision come from Redis itself: INFO commandstats before and
// after the run, FCALL calls divided by the decisions made (at most 1.00;
// below it when the store coalesced several decisions into one call). The
// store's own count of calls sent is printed beside it.
//
// Prints one JSON line:
//   {"side":"sluice","algorithm":"fixed_window","mode":"pass","depth":16,...,
//    "decisions_per_s":..,"p50_us":..,"p99_us":..,"calls_per_decision":0.031,...}
//
// Helper modes for bench/redis/run.sh (they print and exit):
//   --print-library       the function library, as FUNCTION LOAD takes it
//   --print-fcall-args    the FCALL of one decision this run would make, one
//                         argument per line (empty lines are empty
//                         arguments), with the key spelled for
//                         redis-benchmark: the literal key for --keys 1,
//                         "user-__rand_int__" otherwise
//
// Usage: sluice_bench_redis --url redis://127.0.0.1:6379 [--depth 16]
//          [--seconds 3] [--keys 1] [--algorithm fixed_window] [--mode pass|deny]
//          [--rate R] [--lease -1|N] [--calls-in-flight 2] [--window-state text|integer]
//          [--ca-file ca.pem --info-url redis://127.0.0.1:6379]   (with a rediss:// --url)
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/limiter.h"
#include "sluice/rate.h"
#include "sluice/store/redis_store.h"
#include "store/redis/script.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

struct Flags {
  std::string url = "redis://127.0.0.1:6379";
  int depth = 1;
  double seconds = 3;
  int64_t keys = 1;
  std::string algorithm = "fixed_window";
  std::string mode = "pass";
  std::string rate;  // default from mode
  int64_t burst = 0;
  int timeout_ms = 1000;
  int calls_in_flight = 2;   // store.redis.calls_in_flight
  std::string window_state;  // store.redis.window_state; empty: the default
  bool print_library = false;
  bool print_fcall_args = false;
  // The limit leased (docs/distributed.md, "Leased limits"): 0 none, -1
  // auto, else the slice size.
  int64_t lease = 0;
  std::string ca_file;   // store.redis.tls.ca_file, with a rediss:// url
  std::string info_url;  // where INFO commandstats is read; empty: url (a
                         // plain port of the same server with rediss://)
};

std::string KeyName(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "user-%012lld", static_cast<long long>(n));
  return buf;
}

// calls= and usec= (time inside Redis) per command from INFO commandstats,
// on a connection of its own.
struct CommandStat {
  int64_t calls = 0;
  int64_t usec = 0;
};
absl::StatusOr<std::map<std::string, CommandStat>> CommandCalls(const sluice::RedisUrl& url) {
  redisContext* c = redisConnect(url.host.c_str(), url.port);
  if (c == nullptr || c->err != 0) {
    std::string err = c != nullptr ? c->errstr : "out of memory";
    if (c != nullptr) redisFree(c);
    return absl::UnavailableError("INFO connection: " + err);
  }
  auto* reply = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
  std::map<std::string, CommandStat> calls;
  if (reply != nullptr && reply->type == REDIS_REPLY_STRING) {
    // cmdstat_fcall:calls=123,usec=...
    const std::string text(reply->str, reply->len);
    size_t at = 0;
    while ((at = text.find("cmdstat_", at)) != std::string::npos) {
      const size_t colon = text.find(':', at);
      const size_t eq = text.find("calls=", colon);
      const size_t us = text.find("usec=", colon);
      if (colon == std::string::npos || eq == std::string::npos || us == std::string::npos) break;
      calls[text.substr(at + 8, colon - at - 8)] = {std::stoll(text.substr(eq + 6)),
                                                    std::stoll(text.substr(us + 5))};
      at = us;
    }
  }
  if (reply != nullptr) freeReplyObject(reply);
  redisFree(c);
  return calls;
}

// One chain of decisions, each started by the previous one's completion.
// Touched by one thread at a time (the caller, then the store's I/O thread).
struct alignas(64) Lane {
  // Decisions to start: a completion that comes while one is being started
  // (answered before AcquireAsync returned: a lease's slice, a certain
  // denial) adds one for that loop, instead of starting it one call deeper.
  std::atomic<int> to_issue{0};
  uint64_t rng = 0;
  int64_t done = 0;
  int64_t allowed = 0;
  int64_t errors = 0;  // an error status or a store_error decision
  std::vector<int64_t> latency_ns;
};

class Runner {
 public:
  Runner(sluice::Limiter& limiter, int64_t keys, int depth) : limiter_(limiter), lanes_(depth) {
    names_.reserve(static_cast<size_t>(keys));
    for (int64_t i = 0; i < keys; ++i) names_.push_back(KeyName(i));
    for (size_t i = 0; i < lanes_.size(); ++i) {
      lanes_[i].rng = 0x9E3779B97F4A7C15ull * (i + 1);
      lanes_[i].latency_ns.reserve(1 << 16);
    }
  }

  // Runs for `seconds`, then waits for every lane to drain; returns the
  // elapsed time from the first start to the last completion.
  double Run(double seconds) {
    running_ = static_cast<int>(lanes_.size());
    const auto start = SteadyClock::now();
    // Stopped from a thread of its own: when answers come before
    // AcquireAsync returns (a lease's slice, a certain denial), a lane's
    // loop below runs on this thread until then.
    std::thread stopper([this, seconds] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      stop_.store(true, std::memory_order_relaxed);
    });
    for (Lane& lane : lanes_) Issue(lane);
    stopper.join();
    drained_.get_future().wait();
    return std::chrono::duration<double>(last_done_ - start).count();
  }

  const std::vector<Lane>& lanes() const { return lanes_; }

 private:
  void Issue(Lane& lane) {
    if (lane.to_issue.fetch_add(1) != 0) return;
    do {
      IssueOne(lane);
    } while (lane.to_issue.fetch_sub(1) != 1);
  }

  void IssueOne(Lane& lane) {
    // xorshift64*: no division when there is one key.
    lane.rng ^= lane.rng >> 12;
    lane.rng ^= lane.rng << 25;
    lane.rng ^= lane.rng >> 27;
    const uint64_t r = lane.rng * 0x2545F4914F6CDD1Dull;
    const std::string& key = names_.size() == 1 ? names_[0] : names_[r % names_.size()];
    const auto start = SteadyClock::now();
    limiter_.AcquireAsync(
        key, sluice::SystemClock::Default().Now(), 1,
        [this, &lane, start](absl::StatusOr<sluice::PolicyDecision> d) {
          const auto end = SteadyClock::now();
          lane.latency_ns.push_back(
              std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
          ++lane.done;
          if (!d.ok() || d->store_error) {
            ++lane.errors;
          } else if (d->allowed) {
            ++lane.allowed;
          }
          if (!stop_.load(std::memory_order_relaxed)) return Issue(lane);
          if (running_.fetch_sub(1) == 1) {
            last_done_ = end;
            drained_.set_value();
          }
        });
  }

  sluice::Limiter& limiter_;
  std::vector<std::string> names_;
  std::vector<Lane> lanes_;
  std::atomic<bool> stop_{false};
  std::atomic<int> running_{0};
  SteadyClock::time_point last_done_;
  std::promise<void> drained_;
};

int64_t Percentile(std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[i];
}

int Main(const Flags& flags) {
  if (flags.print_library) {
    std::fwrite(sluice::redis::FunctionLibrary().data(), 1, sluice::redis::FunctionLibrary().size(),
                stdout);
    return 0;
  }
  const std::optional<sluice::Algorithm> algorithm = sluice::AlgorithmFromName(flags.algorithm);
  if (!algorithm) {
    std::fprintf(stderr, "unknown algorithm %s\n", flags.algorithm.c_str());
    return 2;
  }
  if (flags.mode != "pass" && flags.mode != "deny") {
    std::fprintf(stderr, "--mode is pass or deny\n");
    return 2;
  }
  // pass: a rate nobody reaches here (and within a sliding window's integer
  // form, the default); deny: one per minute, so every decision after a
  // key's first is a denial.
  const std::string rate_text = !flags.rate.empty()    ? flags.rate
                                : flags.mode == "pass" ? "1000000/s"
                                                       : "1/min";
  absl::StatusOr<sluice::Rate> rate = sluice::ParseRate(rate_text);
  if (!rate.ok()) {
    std::fprintf(stderr, "--rate: %s\n", std::string(rate.status().message()).c_str());
    return 2;
  }
  const sluice::LimitOptions limit{.algorithm = *algorithm, .rate = *rate, .burst = flags.burst};
  absl::StatusOr<sluice::LimitConfig> config = sluice::MakeLimit(limit);
  if (!config.ok()) {
    std::fprintf(stderr, "limit: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<sluice::RedisUrl> url = sluice::ParseRedisUrl(flags.url);
  if (!url.ok()) {
    std::fprintf(stderr, "--url: %s\n", std::string(url.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<sluice::RedisUrl> info_url =
      sluice::ParseRedisUrl(flags.info_url.empty() ? flags.url : flags.info_url);
  if (!info_url.ok() || info_url->tls) {
    std::fprintf(stderr, "--info-url: a redis:// url of the same server (%s)\n",
                 std::string(info_url.status().message()).c_str());
    return 2;
  }

  absl::StatusOr<std::unique_ptr<sluice::RedisStore>> store = sluice::RedisStore::Connect(
      {.url = flags.url,
       .tls = {.ca_file = flags.ca_file},
       .timeout = sluice::Duration::Millis(flags.timeout_ms),
       .calls_in_flight = flags.calls_in_flight,
       .window_state = flags.window_state == "text" ? sluice::WindowState::kText
                       : flags.window_state == "integer"
                           ? sluice::WindowState::kInteger
                           : sluice::RedisStoreOptions{}.window_state});
  if (!store.ok()) {
    std::fprintf(stderr, "connect: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }

  if (flags.print_fcall_args) {
    // The Limiter's table for this limit names the same Redis key.
    absl::StatusOr<std::shared_ptr<sluice::LimitTable>> table =
        (*store)->OpenNamedTable(*config, "bench");
    if (!table.ok()) {
      std::fprintf(stderr, "%s\n", std::string(table.status().message()).c_str());
      return 1;
    }
    const std::string key = flags.keys == 1 ? KeyName(0) : "user-__rand_int__";
    // The short form of a part, as the store sends it: decide at Redis'
    // time, the cost, the limit.
    const std::vector<std::string> args = {
        "FCALL",
        std::string(sluice::redis::FunctionName()),
        "1",
        (*store)->RedisKey(**table, key),
        "d",
        "1",
        sluice::redis::LimitParams(
            *config, (*store)->options().window_state == sluice::WindowState::kInteger)};
    for (const std::string& a : args) std::printf("%s\n", a.c_str());
    return 0;
  }

  std::vector<std::optional<sluice::LeaseOptions>> leases;
  if (flags.lease != 0) {
    leases.push_back(sluice::LeaseOptions{.size = std::max<int64_t>(flags.lease, 0)});
  }
  absl::StatusOr<std::unique_ptr<sluice::Limiter>> limiter = sluice::Limiter::Create(
      **store, {.name = "bench", .limits = {limit}, .leases = std::move(leases)});
  if (!limiter.ok()) {
    std::fprintf(stderr, "limiter: %s\n", std::string(limiter.status().message()).c_str());
    return 1;
  }

  Runner runner(**limiter, flags.keys, flags.depth);
  absl::StatusOr<std::map<std::string, CommandStat>> before = CommandCalls(*info_url);
  if (!before.ok()) {
    std::fprintf(stderr, "%s\n", std::string(before.status().message()).c_str());
    return 1;
  }
  const uint64_t calls_before = (*store)->Health().calls;
  const double elapsed = runner.Run(flags.seconds);
  absl::StatusOr<std::map<std::string, CommandStat>> after = CommandCalls(*info_url);
  if (!after.ok()) {
    std::fprintf(stderr, "%s\n", std::string(after.status().message()).c_str());
    return 1;
  }

  int64_t done = 0, allowed = 0, errors = 0;
  std::vector<int64_t> latency;
  for (const Lane& lane : runner.lanes()) {
    done += lane.done;
    allowed += lane.allowed;
    errors += lane.errors;
    latency.insert(latency.end(), lane.latency_ns.begin(), lane.latency_ns.end());
  }
  std::sort(latency.begin(), latency.end());
  // Calls: what Redis received from clients, FCALL. The rest of
  // commandstats but INFO (and FUNCTION, which loads the library) counts the
  // commands the function itself ran (TIME, GET, SET, ...), which cost no
  // round trip. Redis' time per decision inside FCALL is printed too.
  int64_t fcall = 0, inner = 0, fcall_usec = 0;
  for (const auto& [name, stat] : *after) {
    const auto it = before->find(name);
    const int64_t delta = stat.calls - (it == before->end() ? 0 : it->second.calls);
    if (name == "fcall") {
      fcall = delta;
      fcall_usec = stat.usec - (it == before->end() ? 0 : it->second.usec);
    } else if (name != "info" && !name.starts_with("function")) {
      inner += delta;
    }
  }
  const int64_t sent = static_cast<int64_t>((*store)->Health().calls - calls_before);
  const double n = static_cast<double>(std::max<int64_t>(done, 1));
  std::printf(
      "{\"side\":\"sluice\",\"algorithm\":\"%s\",\"mode\":\"%s\",\"rate\":\"%s\",\"depth\":%d,"
      "\"keys\":%lld,\"seconds\":%.3f,\"decisions\":%lld,\"decisions_per_s\":%.0f,"
      "\"p50_us\":%.1f,\"p99_us\":%.1f,\"allowed_fraction\":%.4f,\"errors\":%lld,"
      "\"calls_per_decision\":%.3f,\"client_calls_per_decision\":%.3f,"
      "\"function_commands_per_decision\":%.3f,\"redis_us_per_decision\":%.2f,"
      "\"lease\":%lld,\"allowed\":%lld}\n",
      flags.algorithm.c_str(), flags.mode.c_str(), rate_text.c_str(), flags.depth,
      static_cast<long long>(flags.keys), elapsed, static_cast<long long>(done), done / elapsed,
      Percentile(latency, 0.50) / 1e3, Percentile(latency, 0.99) / 1e3, allowed / n,
      static_cast<long long>(errors), fcall / n, sent / n, inner / n,
      static_cast<double>(fcall_usec) / n, static_cast<long long>(flags.lease),
      static_cast<long long>(allowed));
  return errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"sluice_bench_redis: the Redis store's decisions per second at a fixed depth"};
  app.add_option("--url", flags.url, "redis://host:port, or rediss:// for TLS");
  app.add_option("--ca-file", flags.ca_file, "with rediss://: the authority to trust (PEM)");
  app.add_option("--info-url", flags.info_url,
                 "redis://host:port of the same server, where INFO is read (default: --url)");
  app.add_option("--depth", flags.depth, "decisions in flight")->check(CLI::Range(1, 100000));
  app.add_option("--seconds", flags.seconds, "how long to run")->check(CLI::Range(0.1, 600.0));
  app.add_option("--keys", flags.keys, "distinct keys, picked uniformly")
      ->check(CLI::Range(int64_t{1}, int64_t{100'000'000}));
  app.add_option("--algorithm", flags.algorithm, "fixed_window, gcra, token_bucket, ...");
  app.add_option("--mode", flags.mode, "pass (nothing denied) or deny (all but the first)");
  app.add_option("--rate", flags.rate, "override the mode's rate (e.g. 100/s)");
  app.add_option("--burst", flags.burst, "bucket algorithms; default the rate's limit");
  app.add_option("--timeout-ms", flags.timeout_ms, "per call; the machine is shared");
  app.add_option("--calls-in-flight", flags.calls_in_flight,
                 "calls to Redis in flight at once (store.redis.calls_in_flight)")
      ->check(CLI::Range(1, 16));
  app.add_option("--window-state", flags.window_state,
                 "how window states are kept (store.redis.window_state; default: the store's)")
      ->check(CLI::IsMember({"text", "integer"}));
  app.add_option(
      "--lease", flags.lease,
      "lease the limit (fixed_window, gcra, token_bucket): -1 slices of size auto, N slices of N");
  app.add_flag("--print-library", flags.print_library, "print the function library and exit");
  app.add_flag("--print-fcall-args", flags.print_fcall_args,
               "print the FCALL arguments of one decision, one per line, and exit");
  CLI11_PARSE(app, argc, argv);
  return Main(flags);
}
