// sluice_bench_memory: bytes per key of the memory store, from measured RSS.
//
// For each (algorithm, N) it forks a child, which reads VmRSS from
// /proc/self/status, fills N distinct keys ("user-<n>", at most 15 bytes, so
// stored inline) into a fresh MemoryStore with max_keys = N, each with one
// Decide of cost 1 (a fresh key always passes, so every call stores its key;
// the child checks stats().keys == N and no eviction), reads VmRSS again and
// prints one JSON line:
//   {"algorithm": "gcra", "keys": 10000000, "rss_before_kb": ..,
//    "rss_after_kb": .., "bytes_per_key": .., "insert_ns": ..}
// A child per measurement, so that what one measurement freed and the
// allocator kept cannot hide the next one's growth.
//
// Usage: sluice_bench_memory [--keys=N[,N...]] [--algorithms=a[,b...]]
// Defaults: --keys=100000,7500000,10000000 (7.5M: just after the store's
//           per-shard tables doubled, the emptiest they get)
//           --algorithms=gcra,token_bucket,fixed_window,sliding_window,sliding_log
#include <sys/wait.h>
#include <unistd.h>

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

int Measure(sluice::Algorithm algorithm, const std::string& name, int64_t n) {
  sluice::LimitOptions options;
  options.algorithm = algorithm;
  options.rate = sluice::Rate{100, sluice::Duration::Seconds(1)};
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
    sluice::MemoryStore store({.max_keys = n});
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
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
            .count() /
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
        "\"rss_after_kb\": %lld, \"bytes_per_key\": %.1f, \"insert_ns\": %.1f}\n",
        name.c_str(), static_cast<long long>(n), static_cast<long long>(before_kb),
        static_cast<long long>(after_kb),
        static_cast<double>(after_kb - before_kb) * 1024.0 / static_cast<double>(n), insert_ns);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> counts = {100'000, 7'500'000, 10'000'000};
  std::vector<std::string> names = {"gcra", "token_bucket", "fixed_window", "sliding_window",
                                    "sliding_log"};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind("--keys=", 0) == 0) {
      counts.clear();
      for (const std::string& s : Split(arg.substr(7))) counts.push_back(std::stoll(s));
    } else if (arg.rfind("--algorithms=", 0) == 0) {
      names = Split(arg.substr(13));
    } else {
      std::fprintf(stderr, "usage: %s [--keys=N,...] [--algorithms=a,...]\n", argv[0]);
      return 2;
    }
  }
  int failures = 0;
  for (int64_t n : counts) {
    for (const std::string& name : names) {
      const std::optional<sluice::Algorithm> algorithm = sluice::AlgorithmFromName(name);
      if (!algorithm || *algorithm == sluice::Algorithm::kLeakyBucket) {
        std::fprintf(stderr, "unsupported algorithm %s\n", name.c_str());
        return 2;
      }
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("fork");
        return 1;
      }
      if (pid == 0) _exit(Measure(*algorithm, name, n));
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "measurement %s/%lld failed\n", name.c_str(),
                     static_cast<long long>(n));
        ++failures;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
