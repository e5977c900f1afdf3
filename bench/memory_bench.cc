// sluice_bench_memory: bytes per key of the memory store, from measured RSS;
// with --flood, the pauses of decisions while a flood goes past max_keys.
//
// For each (algorithm, N) it forks a child, which reads VmRSS from
// /proc/self/status, fills N distinct keys ("user-<n>", at most 15 bytes, so
// stored inline) into a fresh MemoryStore with max_keys = N, each with one
// Decide of cost 1 (a fresh key always passes, so every call stores its key;
// the child checks stats().keys == N and no eviction), reads VmRSS again and
// prints one JSON line:
//   {"algorithm": "gcra", "keys": 10000000, "rss_before_kb": ..,
//    "rss_after_kb": .., "bytes_per_key": .., "insert_ns": .., "on_full": ..,
//    "remembered_table_bytes": ..}
// With on_full: remember (the default) the store, once it nears full,
// commits the pages of its table of evicted keys ahead of need (about 48
// bytes per slot of max_keys), so RSS grows by that table too; --on_full=evict
// measures the keys alone.
// A child per measurement, so that what one measurement freed and the
// allocator kept cannot hide the next one's growth.
//
// Usage: sluice_bench_memory [--keys=N[,N...]] [--algorithms=a[,b...]] [--on_full=remember,evict]
//                            [--rate=N]
//        sluice_bench_memory --flood [--keys=N,...] [--limits=L,...] [--on_full=remember,evict]
// --rate: each key's limit, N a second (default 100; a window algorithm's
// state is packed in one word only for limits that leave its word room:
// docs/algorithms.md).
// Defaults: --keys=100000,7500000,10000000 (7.5M: just after the store's
//           per-shard tables doubled, the emptiest they get)
//           --algorithms=gcra,token_bucket,fixed_window,sliding_window,sliding_log,
//                        leaky_bucket_police,leaky_bucket_shape
//
// With --flood it measures instead how long decisions take while a flood of
// new keys goes past max_keys, for each N of --keys (default 1000000) and
// each L of --limits (default 1,16), in a forked child: a MemoryStore with
// max_keys = N and L limits (even ones token_bucket 100/s, whose keys are
// fresh again 10 ms after their one request; odd ones fixed_window 5/day,
// whose keys are never fresh during the run: forced evictions), one thread
// deciding N new keys (the fill), then 2N more (the flood), each new key on
// the next limit, with every 16th decision on one hot key instead; time is
// passed in, 1 us per decision. Decisions per second include the timing
// itself (two clock reads per decision, a thread CPU-time read per 16).
// For the flood's decisions it prints one JSON
// line: the wall time of single decisions (p50, p99, p99.9, max: what a
// request would wait), the CPU time of runs of 16 consecutive decisions
// (p99.9, max: the work done, which a shared machine's scheduling does not
// inflate), decisions per second and the evictions:
//   {"flood": true, "max_keys": .., "limits": .., "decisions_per_s": ..,
//    "wall_us": {"p50": .., "p99": .., "p999": .., "max": ..},
//    "run16_cpu_us": {"p999": .., "max": ..}, "fresh_evictions": .., ...}
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/store/memory_store.h"

namespace {

int64_t VmRssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const size_t end = comma == std::string_view::npos ? text.size() : comma;
    if (end > start) out.emplace_back(text.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

const char* OnFullName(sluice::OnFull on_full) {
  return on_full == sluice::OnFull::kRemember ? "remember"
         : on_full == sluice::OnFull::kEvict  ? "evict"
                                              : "deny_new";
}

int Measure(sluice::Algorithm algorithm, sluice::LeakyMode mode, const std::string& name, int64_t n,
            sluice::OnFull on_full, int64_t per_second) {
  sluice::LimitOptions options;
  options.algorithm = algorithm;
  options.mode = mode;
  options.rate = sluice::Rate{per_second, sluice::Duration::Seconds(1)};
  absl::StatusOr<sluice::LimitConfig> config = sluice::MakeLimit(options);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  const sluice::Time now = sluice::SystemClock::Default().Now();
  char key[16] = "user-";
  constexpr size_t kPrefix = 5;

  const int64_t before_kb = VmRssKb();
  const auto start = std::chrono::steady_clock::now();
  {
    sluice::MemoryStore store({.max_keys = n, .on_full = on_full});
    absl::StatusOr<std::shared_ptr<sluice::LimitTable>> table = store.OpenTable(*config);
    if (!table.ok()) return 1;
    for (int64_t i = 0; i < n; ++i) {
      char* end = std::to_chars(key + kPrefix, key + sizeof key, i).ptr;
      absl::StatusOr<sluice::Decision> d =
          (*table)->Decide(std::string_view(key, static_cast<size_t>(end - key)), now, 1);
      if (!d.ok() || !d->allowed) {
        std::fprintf(stderr, "key %lld was not admitted\n", static_cast<long long>(i));
        return 1;
      }
    }
    const double insert_ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
        static_cast<double>(n);
    const int64_t after_kb = VmRssKb();
    const sluice::MemoryStoreStats stats = store.stats();
    if (stats.keys != n || stats.fresh_evictions != 0 || stats.forced_evictions != 0) {
      std::fprintf(stderr, "store holds %lld keys (want %lld), evictions %lld/%lld\n",
                   static_cast<long long>(stats.keys), static_cast<long long>(n),
                   static_cast<long long>(stats.fresh_evictions),
                   static_cast<long long>(stats.forced_evictions));
      return 1;
    }
    std::printf(
        "{\"algorithm\": \"%s\", \"keys\": %lld, \"rss_before_kb\": %lld, "
        "\"rss_after_kb\": %lld, \"bytes_per_key\": %.1f, \"insert_ns\": %.1f, "
        "\"on_full\": \"%s\", \"remembered_table_bytes\": %lld}\n",
        name.c_str(), static_cast<long long>(n), static_cast<long long>(before_kb),
        static_cast<long long>(after_kb),
        static_cast<double>(after_kb - before_kb) * 1024.0 / static_cast<double>(n), insert_ns,
        OnFullName(on_full), static_cast<long long>(stats.remembered_bytes));
    std::fflush(stdout);
  }
  return 0;
}

int64_t ThreadCpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The q-quantile of `values` (reordered), in microseconds.
double QuantileUs(std::vector<int64_t>& values, double q) {
  if (values.empty()) return 0;
  const auto k =
      std::min(values.size() - 1, static_cast<size_t>(q * static_cast<double>(values.size())));
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(k), values.end());
  return static_cast<double>(values[k]) / 1000.0;
}

int Flood(int64_t n, int limits, sluice::OnFull on_full) {
  sluice::MemoryStore store({.max_keys = n, .on_full = on_full});
  std::vector<std::shared_ptr<sluice::LimitTable>> tables;
  for (int i = 0; i < limits; ++i) {
    sluice::LimitOptions options;
    options.algorithm =
        i % 2 == 0 ? sluice::Algorithm::kTokenBucket : sluice::Algorithm::kFixedWindow;
    options.rate = i % 2 == 0 ? sluice::Rate{100, sluice::Duration::Seconds(1)}
                              : sluice::Rate{5, sluice::Duration::Days(1)};
    absl::StatusOr<sluice::LimitConfig> config = sluice::MakeLimit(options);
    if (!config.ok()) return 1;
    absl::StatusOr<std::shared_ptr<sluice::LimitTable>> table = store.OpenTable(*config);
    if (!table.ok()) return 1;
    tables.push_back(*std::move(table));
  }
  const sluice::Time start = sluice::Time::FromUnixMicros(1'700'000'000'000'000);
  constexpr int64_t kRun = 16;
  const int64_t flood = 2 * n;
  std::vector<int64_t> wall_ns;
  wall_ns.reserve(static_cast<size_t>(flood));
  std::vector<int64_t> run_cpu_ns;
  run_cpu_ns.reserve(static_cast<size_t>(flood / kRun));
  char key[24] = "flood-";
  constexpr size_t kPrefix = 6;
  int64_t run_cpu_start = ThreadCpuNanos();
  std::chrono::steady_clock::time_point flood_start;
  int64_t restricted = 0;
  for (int64_t i = 0; i < n + flood; ++i) {
    if (i == n) flood_start = std::chrono::steady_clock::now();
    const sluice::Time now = start + sluice::Duration::Micros(i);
    const auto before = std::chrono::steady_clock::now();
    absl::StatusOr<sluice::Decision> d;
    if (i % kRun == 0) {
      d = tables[0]->Decide("hot", now, 1);
    } else {
      char* end = std::to_chars(key + kPrefix, key + sizeof key, i).ptr;
      d = tables[static_cast<size_t>(i % limits)]->Decide(
          std::string_view(key, static_cast<size_t>(end - key)), now, 1);
      // A new key denied: one a remembered key's cells restrict (on_full:
      // remember), counted; with evict, never.
      if (d.ok() && !d->allowed) {
        if (on_full != sluice::OnFull::kRemember) d = absl::InternalError("a new key was denied");
        ++restricted;
      }
    }
    const auto after = std::chrono::steady_clock::now();
    if (!d.ok()) {
      std::fprintf(stderr, "decision %lld: %s\n", static_cast<long long>(i),
                   std::string(d.status().message()).c_str());
      return 1;
    }
    if (i >= n) {
      wall_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(after - before).count());
    }
    if (i % kRun == kRun - 1) {
      const int64_t cpu = ThreadCpuNanos();
      if (i >= n) run_cpu_ns.push_back(cpu - run_cpu_start);
      run_cpu_start = cpu;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  const sluice::MemoryStoreStats stats = store.stats();
  if (stats.keys > n) {
    std::fprintf(stderr, "store holds %lld keys, max_keys %lld\n",
                 static_cast<long long>(stats.keys), static_cast<long long>(n));
    return 1;
  }
  std::printf(
      "{\"flood\": true, \"max_keys\": %lld, \"limits\": %d, \"flood_keys\": %lld, "
      "\"decisions_per_s\": %.0f, \"wall_us\": {\"p50\": %.2f, \"p99\": %.2f, \"p999\": %.1f, "
      "\"max\": %.0f}, \"run16_cpu_us\": {\"p999\": %.0f, \"max\": %.0f}, \"keys\": %lld, "
      "\"fresh_evictions\": %lld, \"forced_evictions\": %lld, \"reclaim_passes\": %lld, "
      "\"on_full\": \"%s\", \"remembered\": %lld, \"recalled\": %lld, "
      "\"new_keys_restricted\": %lld}\n",
      static_cast<long long>(n), limits, static_cast<long long>(flood),
      static_cast<double>(flood) / seconds, QuantileUs(wall_ns, 0.5), QuantileUs(wall_ns, 0.99),
      QuantileUs(wall_ns, 0.999), QuantileUs(wall_ns, 1.0), QuantileUs(run_cpu_ns, 0.999),
      QuantileUs(run_cpu_ns, 1.0), static_cast<long long>(stats.keys),
      static_cast<long long>(stats.fresh_evictions), static_cast<long long>(stats.forced_evictions),
      static_cast<long long>(stats.reclaim_passes), OnFullName(on_full),
      static_cast<long long>(stats.remembered), static_cast<long long>(stats.recalled),
      static_cast<long long>(restricted));
  std::fflush(stdout);
  return 0;
}

// Runs `measure` in a forked child; returns whether it succeeded.
template <typename Fn>
bool InChild(Fn&& measure) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return false;
  }
  if (pid == 0) _exit(measure());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> counts;
  std::vector<std::string> names = {
      "gcra",        "token_bucket",        "fixed_window",      "sliding_window",
      "sliding_log", "leaky_bucket_police", "leaky_bucket_shape"};
  std::vector<int> limit_counts = {1, 16};
  bool flood = false;
  int64_t per_second = 100;
  std::vector<sluice::OnFull> on_fulls = {sluice::OnFull::kRemember};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind("--keys=", 0) == 0) {
      for (const std::string& s : Split(arg.substr(7))) counts.push_back(std::stoll(s));
    } else if (arg.rfind("--algorithms=", 0) == 0) {
      names = Split(arg.substr(13));
    } else if (arg.rfind("--rate=", 0) == 0) {
      per_second = std::stoll(std::string(arg.substr(7)));
      if (per_second < 1) return 2;
    } else if (arg == "--flood") {
      flood = true;
    } else if (arg.rfind("--on_full=", 0) == 0) {
      on_fulls.clear();
      for (const std::string& m : Split(arg.substr(10))) {
        if (m == "remember") {
          on_fulls.push_back(sluice::OnFull::kRemember);
        } else if (m == "evict") {
          on_fulls.push_back(sluice::OnFull::kEvict);
        } else {
          std::fprintf(stderr, "--on_full: remember or evict\n");
          return 2;
        }
      }
    } else if (arg.rfind("--limits=", 0) == 0) {
      limit_counts.clear();
      for (const std::string& s : Split(arg.substr(9))) limit_counts.push_back(std::stoi(s));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--keys=N,...] [--algorithms=a,...] [--on_full=remember,evict] "
                   "[--rate=N]\n"
                   "       %s --flood [--keys=N,...] [--limits=L,...] [--on_full=remember,evict]\n",
                   argv[0], argv[0]);
      return 2;
    }
  }
  int failures = 0;
  if (flood) {
    if (counts.empty()) counts = {1'000'000};
    for (int64_t n : counts) {
      for (int limits : limit_counts) {
        for (sluice::OnFull on_full : on_fulls) {
          if (n < 1 || limits < 1) return 2;
          if (!InChild([&] { return Flood(n, limits, on_full); })) {
            std::fprintf(stderr, "flood %lld/%d failed\n", static_cast<long long>(n), limits);
            ++failures;
          }
        }
      }
    }
    return failures == 0 ? 0 : 1;
  }
  if (counts.empty()) counts = {100'000, 7'500'000, 10'000'000};
  for (int64_t n : counts) {
    for (const std::string& name : names) {
      // A leaky bucket is named with its mode, leaky_bucket_police or
      // leaky_bucket_shape.
      const bool shape = name == "leaky_bucket_shape";
      const std::optional<sluice::Algorithm> algorithm = shape || name == "leaky_bucket_police"
                                                             ? sluice::Algorithm::kLeakyBucket
                                                             : sluice::AlgorithmFromName(name);
      if (!algorithm || (*algorithm == sluice::Algorithm::kLeakyBucket && name == "leaky_bucket")) {
        std::fprintf(stderr, "unsupported algorithm %s\n", name.c_str());
        return 2;
      }
      const sluice::LeakyMode mode = shape ? sluice::LeakyMode::kShape : sluice::LeakyMode::kPolice;
      for (sluice::OnFull on_full : on_fulls) {
        if (!InChild([&] { return Measure(*algorithm, mode, name, n, on_full, per_second); })) {
          std::fprintf(stderr, "measurement %s/%lld failed\n", name.c_str(),
                       static_cast<long long>(n));
          ++failures;
        }
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
