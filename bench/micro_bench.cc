// sluice_bench: micro-benchmarks of the algorithms and the memory store, with
// the baselines BENCH.md asks for (an uncontended CAS loop, a clock read)
// measured in the same binary, so every figure can be given as a ratio
// against a floor from the same run. bench/run.sh runs it and prints the
// ratios; bench/README.md says what each benchmark measures.
//
// Families (names as printed by Google Benchmark, less /min_time:...):
//   BM_CasLoop, BM_ClockNow, BM_MemoryChase      baselines
//   BM_SharedCasLoop/threads:N                   one word CASed by every thread
//   BM_Decide/<algorithm>                        pure Decide, time passed in
//   BM_StoreHotKey/<algorithm>/threads:N         one key for all threads
//   BM_LimiterHotKey/gcra/threads:N              Limiter::Acquire, one limit, one key
//   BM_LimiterHotKey/gcra/coarse_clock/threads:N the same on a CoarseClock
//   BM_CoarseClockNow                            one CoarseClock read
//   BM_StoreHotKeyPassing/<alg>/threads:N        one key that every decision passes
//   BM_StoreDistinctKeys/<alg>/threads:N         each thread its own 1,000 keys
//   BM_StoreDistinctKeysDenied/<alg>/threads:N   the same at 100/s: nearly all denied
//   BM_StoreDistinctKeysShared/<alg>/threads:N   the same keys passing, every shard shared
//                                                by threads before the 1-thread run too
//   BM_StoreDistinctKeysAlone/<alg>              1 thread, the same keys, a store of its own
//   BM_StoreDistinctShards/gcra/threads:N       the same, each thread's keys in its own shards
//   BM_StoreOwnKey/gcra/threads:N                each thread one key, own shard
//   BM_StoreNewKeys/gcra/threads:N               every decision a key never held
//   BM_StoreRandom{100k,10M}/<alg>/threads:N     uniformly random among N keys
//   BM_StoreRandom{100k,10M}TimeIn/<alg>         same, time passed in, no clock
//   BM_MapFloor{100k,10M}/{clock,time_in}        token bucket over a bare
//                                                absl::flat_hash_map (peer floor)
//   BM_MapFloor{100k,10M}/time_in_atomics        the same with the two atomic
//                                                steps a shared store takes
//   BM_TopKeysAdd/{hot,100k}/threads:N           a policy's count of denied keys
//                                                (metrics::TopKeys), one key for
//                                                all threads or 100k random keys
//
// Every store benchmark except the TimeIn ones reads
// SystemClock::Default().Now() once per decision (what the server does per
// request); every benchmark consumes the Decision.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "metrics/top_keys.h"
#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"
#include "store/memory/compact_key.h"

namespace {

using sluice::Algorithm;
using sluice::Decision;
using sluice::Duration;
using sluice::LeakyMode;
using sluice::LimitConfig;
using sluice::LimitOptions;
using sluice::Rate;
using sluice::Time;

// 2023-11-14T22:13:20Z: epoch-sized numbers, as the store sees them.
constexpr int64_t kStartUs = 1'700'000'000'000'000;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "sluice_bench: %s\n", what.c_str());
  std::exit(1);
}

LimitConfig MakeLimitOrDie(const LimitOptions& options) {
  absl::StatusOr<LimitConfig> config = sluice::MakeLimit(options);
  if (!config.ok()) Die(std::string(config.status().message()));
  return *std::move(config);
}

// ---------------------------------------------------------------- baselines

// The floor BENCH.md names: one uncontended compare-and-swap per iteration
// (load, CAS of value+1; the CAS never fails as no one else touches the word).
void BM_CasLoop(benchmark::State& st) {
  std::atomic<int64_t> word{0};
  for (auto _ : st) {
    int64_t seen = word.load(std::memory_order_relaxed);
    while (!word.compare_exchange_weak(seen, seen + 1, std::memory_order_acq_rel,
                                       std::memory_order_relaxed)) {
    }
  }
  benchmark::DoNotOptimize(word.load(std::memory_order_relaxed));
  st.SetItemsProcessed(st.iterations());
}

// The floor of any hot-key update from several threads: every thread CASes
// ONE shared word (value+1), so each update needs the word's cache line in
// its core; with 2 threads the line moves between the cores. Real time per
// update, over all threads.
std::atomic<int64_t> shared_word{0};
void BM_SharedCasLoop(benchmark::State& st) {
  for (auto _ : st) {
    int64_t seen = shared_word.load(std::memory_order_relaxed);
    while (!shared_word.compare_exchange_weak(seen, seen + 1, std::memory_order_acq_rel,
                                              std::memory_order_relaxed)) {
    }
  }
  st.SetItemsProcessed(st.iterations());
}

void BM_ClockNow(benchmark::State& st) {
  const sluice::SystemClock& clock = sluice::SystemClock::Default();
  for (auto _ : st) {
    Time now = clock.Now();
    benchmark::DoNotOptimize(now);
  }
  st.SetItemsProcessed(st.iterations());
}

// The process's CoarseClock (its thread reads the system clock every 250 us).
const sluice::CoarseClock& Coarse() {
  static const sluice::CoarseClock clock;
  return clock;
}

// A CoarseClock read: one relaxed load (its thread refreshes it).
void BM_CoarseClockNow(benchmark::State& st) {
  const sluice::CoarseClock& clock = Coarse();
  for (auto _ : st) {
    Time now = clock.Now();
    benchmark::DoNotOptimize(now);
  }
  st.SetItemsProcessed(st.iterations());
}

// ---------------------------------------------------------------- BM_Decide

// Inter-arrival times drawn once from an exponential distribution (fixed
// seed), cycled through by the loop: the decisions see a Poisson-like stream
// at twice the configured rate, so about half pass and half are denied, with
// branches that are not trivially predictable.
constexpr size_t kSteps = 1 << 12;

const std::array<int64_t, kSteps>& Steps(int64_t mean_us) {
  static std::mutex mu;
  static std::vector<std::pair<int64_t, std::unique_ptr<std::array<int64_t, kSteps>>>> cache;
  std::lock_guard lock(mu);
  for (auto& [mean, steps] : cache) {
    if (mean == mean_us) return *steps;
  }
  auto steps = std::make_unique<std::array<int64_t, kSteps>>();
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> dist(1.0 / static_cast<double>(mean_us));
  for (int64_t& s : *steps) s = static_cast<int64_t>(dist(rng));
  cache.emplace_back(mean_us, std::move(steps));
  return *cache.back().second;
}

// The configured rate of every BM_Decide: 100 per second (burst 100 for the
// bucket algorithms, max_delay 1s for shape); arrivals at 200/s on average.
constexpr int64_t kDecideLimit = 100;
constexpr int64_t kDecideMeanStepUs = 5'000;

// sliding_log (and concurrency, its twin) updates its state in place.
template <typename Config>
void DecideLoopInPlace(benchmark::State& st, const Config& config) {
  const std::array<int64_t, kSteps>& steps = Steps(kDecideMeanStepUs);
  sluice::SlidingLogState state;
  int64_t now_us = kStartUs;
  int64_t allowed = 0;
  size_t i = 0;
  for (auto _ : st) {
    now_us += steps[i++ & (kSteps - 1)];
    const Decision d = Decide(config, state, Time::FromUnixMicros(now_us), 1);
    allowed += d.allowed;
    benchmark::DoNotOptimize(d);
  }
  benchmark::DoNotOptimize(state.size());
  st.counters["allowed"] = static_cast<double>(allowed) / static_cast<double>(st.iterations());
  st.SetItemsProcessed(st.iterations());
}

template <typename Config>
void DecideLoop(benchmark::State& st, const Config& config) {
  if constexpr (std::is_base_of_v<sluice::SlidingLogConfig, Config>) {
    return DecideLoopInPlace(st, config);
  } else {
    const std::array<int64_t, kSteps>& steps = Steps(kDecideMeanStepUs);
    using State = std::decay_t<decltype(Decide(config, {}, Time(), 0).state)>;
    State state{};
    int64_t now_us = kStartUs;
    int64_t allowed = 0;
    size_t i = 0;
    for (auto _ : st) {
      now_us += steps[i++ & (kSteps - 1)];
      const sluice::Outcome<State> out = Decide(config, state, Time::FromUnixMicros(now_us), 1);
      state = out.state;  // carried to the next iteration
      allowed += out.decision.allowed;
      benchmark::DoNotOptimize(out.decision);
    }
    benchmark::DoNotOptimize(state);
    st.counters["allowed"] = static_cast<double>(allowed) / static_cast<double>(st.iterations());
    st.SetItemsProcessed(st.iterations());
  }
}

struct AlgoSpec {
  const char* name;
  Algorithm algorithm;
  LeakyMode mode;
};

constexpr AlgoSpec kSlidingWindow = {"sliding_window", Algorithm::kSlidingWindow,
                                     LeakyMode::kPolice};

constexpr AlgoSpec kAllAlgorithms[] = {
    {"token_bucket", Algorithm::kTokenBucket, LeakyMode::kPolice},
    {"gcra", Algorithm::kGcra, LeakyMode::kPolice},
    {"leaky_bucket_police", Algorithm::kLeakyBucket, LeakyMode::kPolice},
    {"leaky_bucket_shape", Algorithm::kLeakyBucket, LeakyMode::kShape},
    {"fixed_window", Algorithm::kFixedWindow, LeakyMode::kPolice},
    kSlidingWindow,
    {"sliding_log", Algorithm::kSlidingLog, LeakyMode::kPolice},
};

// The one-word algorithms BENCH.md holds to the key-count targets.
constexpr AlgoSpec kKeyAlgorithms[] = {
    {"gcra", Algorithm::kGcra, LeakyMode::kPolice},
    {"token_bucket", Algorithm::kTokenBucket, LeakyMode::kPolice},
    {"fixed_window", Algorithm::kFixedWindow, LeakyMode::kPolice},
};

LimitOptions OptionsFor(const AlgoSpec& spec, int64_t limit) {
  LimitOptions options;
  options.algorithm = spec.algorithm;
  options.rate = Rate{limit, Duration::Seconds(1)};
  options.mode = spec.mode;
  return options;
}

void BM_Decide(benchmark::State& st, AlgoSpec spec) {
  const LimitConfig config = MakeLimitOrDie(OptionsFor(spec, kDecideLimit));
  std::visit([&](const auto& c) { DecideLoop(st, c); }, config);
}

// ---------------------------------------------------------------- store

// The rate of the store benchmarks on a few keys: 100/s per key (burst
// 100). A hot key is then a key far over its limit (nearly every decision
// a denial, as for a key under attack). The "allowed" counter reports the
// mix.
constexpr int64_t kStoreLimit = 100;
// The rate over 100k or 10M random keys, and of the bare map they are set
// against: one no run reaches (100k keys at 1,000/s each pass up to 100
// million decisions a second), so that every decision passes whatever the
// time source. At 100/s a run that reads a clock at 25 million decisions a
// second meets each of 100k keys 250 times a second and is denied about 40%
// of the time, where the bare map, its time passed in at 1 us a decision,
// passes every one: unlike work (a denial computes its wait). The sliding
// window keeps 100/s: it runs over 100k keys with time passed in alone
// (every decision passes), and a limit of 1,000/s would no longer pack its
// state in one word (packed_window.h).
constexpr int64_t kRandomKeysLimit = 1'000;
int64_t RandomKeysLimit(const AlgoSpec& spec) {
  return spec.algorithm == Algorithm::kSlidingWindow ? kStoreLimit : kRandomKeysLimit;
}
// The rate over each thread's own 1,000 keys (BM_StoreDistinctKeys): a
// thread reading the clock at 15-20 million decisions a second meets each of
// its keys 15,000-20,000 times a second, so at 100/s all but 0.5% of its
// decisions were denials, which leave the state as it was and write
// nothing: two threads then measured the shared path's read, not its
// compare-and-swap. At 100,000/s every decision passes and writes its key.
constexpr int64_t kDistinctKeysLimit = 100'000;
// One key at a rate no run reaches (BM_StoreHotKeyPassing): every decision
// passes and writes it, from one thread or both.
constexpr int64_t kHotPassingLimit = 100'000'000;

struct Fixture {
  std::unique_ptr<sluice::MemoryStore> store;
  std::shared_ptr<sluice::LimitTable> table;
};

std::unique_ptr<Fixture> MakeFixture(const AlgoSpec& spec, int64_t max_keys,
                                     int64_t limit = kStoreLimit) {
  auto fixture = std::make_unique<Fixture>();
  fixture->store =
      std::make_unique<sluice::MemoryStore>(sluice::MemoryStoreOptions{.max_keys = max_keys});
  absl::StatusOr<std::shared_ptr<sluice::LimitTable>> table =
      fixture->store->OpenTable(MakeLimitOrDie(OptionsFor(spec, limit)));
  if (!table.ok()) Die(std::string(table.status().message()));
  fixture->table = *std::move(table);
  return fixture;
}

// Inserts every key (cost 1 on a fresh key always passes, so each is stored)
// and checks that the store holds them all.
void Prefill(Fixture& fixture, const std::vector<std::string>& keys) {
  const Time now = sluice::SystemClock::Default().Now();
  const int64_t before = fixture.store->stats().keys;
  for (const std::string& key : keys) {
    absl::StatusOr<Decision> d = fixture.table->Decide(key, now, 1);
    if (!d.ok() || !d->allowed) Die("prefill: a fresh key was not admitted: " + key);
  }
  if (fixture.store->stats().keys != before + static_cast<int64_t>(keys.size())) {
    Die("prefill: the store did not keep every key");
  }
}

// Key sets, built once and shared. "user-<n>": at most 12 bytes, so every
// key is stored inline by the memory store (<= 15 bytes) and, as a
// std::string, lives inside its vector slot (SSO), one 32-byte object.
std::vector<std::string> MakeKeys(const std::string& prefix, size_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

const std::vector<std::string>& Keys100k() {
  static const std::vector<std::string> keys = MakeKeys("user-", 100'000);
  return keys;
}
const std::vector<std::string>& Keys10M() {
  static const std::vector<std::string> keys = MakeKeys("user-", 10'000'000);
  return keys;
}
// Distinct-keys benchmark: thread t uses the 1,000 keys "t<t>-user-<i>".
constexpr int kMaxThreads = 2;
constexpr size_t kPerThreadKeys = 1'000;
const std::vector<std::string>& ThreadKeys(int thread) {
  static const std::array<std::vector<std::string>, kMaxThreads> keys = {
      MakeKeys("t0-user-", kPerThreadKeys), MakeKeys("t1-user-", kPerThreadKeys)};
  return keys.at(thread);
}
// Thread t's own 1,000 keys, all in shards of t's parity (the store's
// current sharding, as OwnKey): no shard, so no line of a table, is written
// by both threads.
const std::vector<std::string>& ShardParityKeys(int thread) {
  static const std::array<std::vector<std::string>, kMaxThreads> keys = [] {
    std::array<std::vector<std::string>, kMaxThreads> k;
    for (int i = 0; k[0].size() < kPerThreadKeys || k[1].size() < kPerThreadKeys; ++i) {
      std::string candidate = "p-user-" + std::to_string(i);
      const size_t parity = (sluice::internal::KeyHash{}(candidate) >> 58) & 1;
      if (k[parity].size() < kPerThreadKeys) k[parity].push_back(std::move(candidate));
    }
    return k;
  }();
  return keys.at(thread);
}
// Own-key benchmark: thread t decides on one key of its own. The two keys
// are picked so that the store's current sharding (the top 6 bits of the
// key's KeyHash, compact_key.h) puts them in different shards: this
// measures two threads that share nothing but the table object.
const std::string& OwnKey(int thread) {
  static const std::array<std::string, kMaxThreads> keys = [] {
    std::array<std::string, kMaxThreads> k = {"t0-own", ""};
    const auto shard = [](const std::string& key) {
      return sluice::internal::KeyHash{}(key) >> 58;
    };
    for (int i = 1; k[1].empty(); ++i) {
      std::string candidate = "t1-own-" + std::to_string(i);
      if (shard(candidate) != shard(k[0])) k[1] = candidate;
    }
    return k;
  }();
  return keys.at(thread);
}

// Fixtures are made on first use by whichever thread gets there first (the
// others wait on the mutex, outside the timed loop) and kept for the 1- and
// 2-thread runs of the same benchmark. Only one 10M-key fixture is kept at a
// time: it is about half a gigabyte.
enum class KeySet {
  kHot,
  kHotPassing,
  kDistinct,
  kDistinctDenied,
  kDistinctShared,
  kDistinctShards,
  kOwn,
  k100k,
  k10M
};

Fixture& GetFixture(KeySet set, const AlgoSpec& spec) {
  static std::mutex mu;
  static std::vector<std::pair<std::string, std::unique_ptr<Fixture>>> fixtures;
  static std::string big_name;
  static std::unique_ptr<Fixture> big;
  const std::string name = std::to_string(static_cast<int>(set)) + "/" + spec.name;
  std::lock_guard lock(mu);
  if (set == KeySet::k10M) {
    if (big_name != name) {
      big.reset();  // free the previous one before building the next
      big = MakeFixture(spec, 10'000'000, RandomKeysLimit(spec));
      Prefill(*big, Keys10M());
      big_name = name;
    }
    return *big;
  }
  for (auto& [n, f] : fixtures) {
    if (n == name) return *f;
  }
  std::unique_ptr<Fixture> f = MakeFixture(
      spec, 1'000'000,
      set == KeySet::k100k         ? RandomKeysLimit(spec)
      : set == KeySet::kHotPassing ? kHotPassingLimit
      : set == KeySet::kDistinct || set == KeySet::kDistinctShared || set == KeySet::kDistinctShards
          ? kDistinctKeysLimit
          : kStoreLimit);
  if (set == KeySet::k100k) Prefill(*f, Keys100k());
  if (set == KeySet::kDistinct || set == KeySet::kDistinctDenied ||
      set == KeySet::kDistinctShared) {
    for (int t = 0; t < kMaxThreads; ++t) Prefill(*f, ThreadKeys(t));
  }
  if (set == KeySet::kDistinctShared) {
    // Another thread decides every key once, so that every shard is shared
    // (and small ones in lines) before the 1-thread run too.
    std::thread other([&f] {
      const Time now = sluice::SystemClock::Default().Now();
      for (int t = 0; t < kMaxThreads; ++t) {
        for (const std::string& key : ThreadKeys(t)) (void)f->table->Decide(key, now, 1);
      }
    });
    other.join();
  }
  fixtures.emplace_back(name, std::move(f));
  return *fixtures.back().second;
}

// xorshift64*, and Lemire's multiply-shift to map onto [0, n): two
// multiplications and three shifts per key pick, no division.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  size_t Below(size_t n) {
    return static_cast<size_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
};

// "allowed": the fraction of decisions that passed, averaged over threads.
void Finish(benchmark::State& st, int64_t allowed) {
  st.counters["allowed"] =
      benchmark::Counter(static_cast<double>(allowed) / static_cast<double>(st.iterations()),
                         benchmark::Counter::kAvgThreads);
  st.SetItemsProcessed(st.iterations());
}

void OneKeyLoop(benchmark::State& st, sluice::LimitTable& table, const std::string& key) {
  const sluice::SystemClock& clock = sluice::SystemClock::Default();
  int64_t allowed = 0;
  for (auto _ : st) {
    absl::StatusOr<Decision> d = table.Decide(key, clock.Now(), 1);
    allowed += d->allowed;
    benchmark::DoNotOptimize(d);
  }
  Finish(st, allowed);
}

// `set`: kHot (a key far over its limit: nearly every decision denied) or
// kHotPassing (every decision passes and writes the key).
void BM_StoreHotKey(benchmark::State& st, AlgoSpec spec, KeySet set) {
  static const std::string key = "user-42";
  OneKeyLoop(st, *GetFixture(set, spec).table, key);
}

void BM_StoreOwnKey(benchmark::State& st, AlgoSpec spec) {
  OneKeyLoop(st, *GetFixture(KeySet::kOwn, spec).table, OwnKey(st.thread_index()));
}

// How the random-key loops get their time.
enum class TimeSource {
  kClock,   // SystemClock::Default().Now() per decision, as the server does
  kCoarse,  // CoarseClock::Now() per decision, as a Limiter given one does
  kPassed,  // a local time advanced 1us per decision: no clock read
};

// Time passed in runs ahead of the clock (1 us a decision, faster than
// decisions take): each run goes on from where the last one left it, so that
// no run goes back in time on the states a run before it wrote (which would
// deny what passes, and compare unlike work: the "allowed" counter shows it).
int64_t passed_until = 0;

// Picks keys at random from `keys`; the next key's bytes are prefetched one
// decision ahead, as a server has the key of the request it is deciding in
// cache (it just parsed it): the miss on the harness' own key vector is not
// the store's cost.
template <typename DecideFn>
void RandomKeysLoop(benchmark::State& st, const std::vector<std::string>& keys, TimeSource source,
                    DecideFn decide) {
  const sluice::SystemClock& clock = sluice::SystemClock::Default();
  const sluice::CoarseClock& coarse = Coarse();
  Rng rng{0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(st.thread_index() + 1)};
  const size_t n = keys.size();
  size_t next = rng.Below(n);
  int64_t now_us = std::max(clock.Now().unix_micros(), passed_until);
  int64_t allowed = 0;
  for (auto _ : st) {
    const std::string& key = keys[next];
    next = rng.Below(n);
    __builtin_prefetch(&keys[next]);
    Time now;
    if (source == TimeSource::kClock) {
      now = clock.Now();
    } else if (source == TimeSource::kCoarse) {
      now = coarse.Now();
    } else {
      now = Time::FromUnixMicros(++now_us);
    }
    const bool ok = decide(key, now);
    allowed += ok;
  }
  if (source == TimeSource::kPassed) passed_until = now_us;
  Finish(st, allowed);
}

bool StoreDecide(sluice::LimitTable& table, const std::string& key, Time now) {
  absl::StatusOr<Decision> d = table.Decide(key, now, 1);
  benchmark::DoNotOptimize(d);
  return d->allowed;
}

// `set`: kDistinct (every decision passes and writes its key),
// kDistinctDenied (100/s: all but about 0.5% denied, nothing written) or
// kDistinctShared (as kDistinct, every shard shared by threads before any
// run: one thread too takes the shared path, not the shard owner's).
void BM_StoreDistinctKeys(benchmark::State& st, AlgoSpec spec, KeySet set) {
  sluice::LimitTable& table = *GetFixture(set, spec).table;
  RandomKeysLoop(st, ThreadKeys(st.thread_index()), TimeSource::kClock,
                 [&](const std::string& key, Time now) { return StoreDecide(table, key, now); });
}

// One thread on the 1,000 keys of BM_StoreDistinctKeys' first thread, in a
// store of its own made for each run: every shard is that thread's alone,
// the owner's path a one-threaded service takes, whatever ran before. The
// single thread BM_StoreDistinctKeys/threads:2 is held to (BENCH.md's 1.8x)
// under --benchmark_enable_random_interleaving, where the 1-thread run of
// BM_StoreDistinctKeys may come after a 2-thread one and find its shards
// shared.
void BM_StoreDistinctKeysAlone(benchmark::State& st, AlgoSpec spec) {
  const std::unique_ptr<Fixture> fixture = MakeFixture(spec, 1'000'000, kDistinctKeysLimit);
  Prefill(*fixture, ThreadKeys(0));
  sluice::LimitTable& table = *fixture->table;
  RandomKeysLoop(st, ThreadKeys(0), TimeSource::kClock,
                 [&](const std::string& key, Time now) { return StoreDecide(table, key, now); });
}

// Distinct keys whose shards differ by thread (ShardParityKeys), every
// decision passing. Before timing, each thread decides every key of both
// sets once, so that with 2 threads every shard is shared (the path
// BM_StoreDistinctKeys takes): what is left of that benchmark's cost here
// is the cache lines its two threads' keys share.
void BM_StoreDistinctShards(benchmark::State& st, AlgoSpec spec) {
  sluice::LimitTable& table = *GetFixture(KeySet::kDistinctShards, spec).table;
  const Time start = sluice::SystemClock::Default().Now();
  for (int t = 0; t < kMaxThreads; ++t) {
    for (const std::string& key : ShardParityKeys(t)) StoreDecide(table, key, start);
  }
  RandomKeysLoop(st, ShardParityKeys(st.thread_index()), TimeSource::kClock,
                 [&](const std::string& key, Time now) { return StoreDecide(table, key, now); });
}

void BM_StoreRandom(benchmark::State& st, AlgoSpec spec, KeySet set, TimeSource source) {
  sluice::LimitTable& table = *GetFixture(set, spec).table;
  RandomKeysLoop(st, set == KeySet::k10M ? Keys10M() : Keys100k(), source,
                 [&](const std::string& key, Time now) { return StoreDecide(table, key, now); });
}

// New keys: every decision is on a key the store has never held, allowed
// and kept (a flood of unique keys): the insert path, which takes the
// shard alone. A fresh store for each run (thread 0 makes it before the
// timed loop, which all threads enter together), large enough that nothing
// is evicted; time passed in. Keys are 9 bytes: the thread and a counter.
void BM_StoreNewKeys(benchmark::State& st, AlgoSpec spec) {
  static std::unique_ptr<Fixture> fixture;
  if (st.thread_index() == 0) fixture = MakeFixture(spec, 64'000'000);
  char key[9];
  key[0] = static_cast<char>('a' + st.thread_index());
  uint64_t n = 0;
  int64_t now_us = sluice::SystemClock::Default().Now().unix_micros();
  int64_t allowed = 0;
  for (auto _ : st) {
    std::memcpy(key + 1, &++n, sizeof n);
    absl::StatusOr<Decision> d = fixture->table->Decide(std::string_view(key, sizeof key),
                                                        Time::FromUnixMicros(++now_us), 1);
    benchmark::DoNotOptimize(d);
    allowed += d->allowed;
  }
  Finish(st, allowed);
  // All threads leave the timed loop together; the last run's store stays
  // until the next run (or the end).
}

// The peer BENCH.md names as the C++ floor: a token bucket over one
// absl::flat_hash_map<std::string, TokenBucketState>, no lock, no sharding,
// no bound on keys, the same key picking and time source as the store
// benchmarks. One thread only (the map is not thread-safe).
struct MapFloor {
  sluice::TokenBucketConfig config;
  absl::flat_hash_map<std::string, sluice::TokenBucketState> map;
};

MapFloor& GetMapFloor(KeySet set) {
  static std::mutex mu;
  static std::unique_ptr<MapFloor> floors[2];
  std::lock_guard lock(mu);
  std::unique_ptr<MapFloor>& floor = floors[set == KeySet::k10M ? 1 : 0];
  if (floor == nullptr) {
    floor =
        std::make_unique<MapFloor>(MapFloor{std::get<sluice::TokenBucketConfig>(MakeLimitOrDie(
                                                OptionsFor(kKeyAlgorithms[1], kRandomKeysLimit))),
                                            {}});
    const std::vector<std::string>& keys = set == KeySet::k10M ? Keys10M() : Keys100k();
    const Time now = sluice::SystemClock::Default().Now();
    for (const std::string& key : keys) {
      floor->map[key] = Decide(floor->config, sluice::TokenBucketState{}, now, 1).state;
    }
  }
  return *floor;
}

// `atomics`: the same, with the two atomic steps a store that threads share
// takes at the least (as the memory store's read gate and cell do): the
// reader announced by a sequentially consistent store before the lookup,
// and the state's first word compare-and-swapped (to itself) after the
// decision. Both are full barriers on x86; the difference from the bare map
// is what thread safety costs at this key count.
// The announcement's slot is a global: a local atomic whose address never
// escapes may be (and was) compiled away, store and all.
std::atomic<const void*> g_floor_reader{nullptr};

void BM_MapFloor(benchmark::State& st, KeySet set, TimeSource source, bool atomics) {
  MapFloor& floor = GetMapFloor(set);
  std::atomic<const void*>& reader = g_floor_reader;
  RandomKeysLoop(st, set == KeySet::k10M ? Keys10M() : Keys100k(), source,
                 [&](const std::string& key, Time now) {
                   if (atomics) reader.store(&floor, std::memory_order_seq_cst);
                   auto it = floor.map.find(key);
                   sluice::TokenBucketState& state = it->second;
                   const sluice::Outcome<sluice::TokenBucketState> out =
                       Decide(floor.config, state, now, 1);
                   state = out.state;
                   if (atomics) {
                     uint64_t word;
                     std::memcpy(&word, &state, sizeof word);
                     std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(&state))
                         .compare_exchange_strong(word, word, std::memory_order_acq_rel);
                     reader.store(nullptr, std::memory_order_release);
                   }
                   benchmark::DoNotOptimize(out.decision);
                   return out.decision.allowed;
                 });
}

// What every denial adds for its policy's top denied keys (the server's
// Policy::CountDenial): TopKeys::Add, under its one lock, one sketch shared
// by every thread. `hot`: one key for all threads (an abusive client); else
// random keys among 100k (a flood of them).
void BM_TopKeysAdd(benchmark::State& st, bool hot) {
  static sluice::metrics::TopKeys* top = nullptr;
  if (st.thread_index() == 0) {
    delete top;
    top = new sluice::metrics::TopKeys();
  }
  const std::vector<std::string>& keys = Keys100k();
  Rng rng{0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(st.thread_index() + 1)};
  const Time now = sluice::SystemClock::Default().Now();
  for (auto _ : st) {
    top->Add(hot ? std::string_view(keys[0]) : std::string_view(keys[rng.Below(keys.size())]), now);
  }
  st.SetItemsProcessed(st.iterations());
}

// The latency of one dependent random load over 512 MiB (a pointer chase
// through a random cyclic permutation of cache lines, 4 KiB pages): the
// floor under any lookup in a table too large for the caches, such as the
// 10M-key store (about as large).
void BM_MemoryChase(benchmark::State& st) {
  constexpr size_t kBytes = size_t{512} << 20;
  constexpr size_t kLineWords = 64 / sizeof(uint64_t);
  static const std::vector<uint64_t>* ring = [] {
    const size_t lines = kBytes / 64;
    auto* words = new std::vector<uint64_t>(kBytes / sizeof(uint64_t));
    std::vector<uint32_t> order(lines);
    for (size_t i = 0; i < lines; ++i) order[i] = static_cast<uint32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    for (size_t i = 0; i < lines; ++i) {
      (*words)[order[i] * kLineWords] = order[(i + 1) % lines] * kLineWords;
    }
    return words;
  }();
  const uint64_t* words = ring->data();
  uint64_t at = 0;
  for (auto _ : st) {
    at = words[at];
    benchmark::DoNotOptimize(at);
  }
  st.SetItemsProcessed(st.iterations());
}

// The public API a C++ user calls: Limiter::Acquire (reads the clock itself),
// one gcra limit, one key.
// The benchmark's limiter: on the system clock, or (`coarse`) on a
// CoarseClock.
sluice::Limiter& HotKeyLimiter(bool coarse) {
  static sluice::MemoryStore store;
  static const sluice::CoarseClock coarse_clock;
  auto make = [](bool on_coarse) {
    absl::StatusOr<std::unique_ptr<sluice::Limiter>> l =
        sluice::Limiter::Create(store, {.name = on_coarse ? "bench-coarse" : "bench",
                                        .limits = {OptionsFor(kKeyAlgorithms[0], kStoreLimit)},
                                        .clock = on_coarse ? &coarse_clock : nullptr});
    if (!l.ok()) Die(std::string(l.status().message()));
    return *std::move(l);
  };
  static const std::unique_ptr<sluice::Limiter> on_system = make(false);
  static const std::unique_ptr<sluice::Limiter> on_coarse = make(true);
  return coarse ? *on_coarse : *on_system;
}

void BM_LimiterHotKey(benchmark::State& st, bool coarse) {
  sluice::Limiter* limiter = &HotKeyLimiter(coarse);
  const std::string key = "user-42";
  int64_t allowed = 0;
  for (auto _ : st) {
    absl::StatusOr<sluice::PolicyDecision> d = limiter->Acquire(key);
    allowed += d->allowed;
    benchmark::DoNotOptimize(d);
  }
  Finish(st, allowed);
}

// Short runs: the machine is shared and the suite must stay within a few
// minutes; run.sh repeats the whole binary and takes medians instead. A
// --benchmark_min_time on the command line overrides it (main).
double min_time = 0.25;

benchmark::internal::Benchmark* Threads12(benchmark::internal::Benchmark* b) {
  return b->MinTime(min_time)->UseRealTime()->Threads(1)->Threads(2);
}

template <typename... Args>
benchmark::internal::Benchmark* Register(const std::string& name, Args&&... args) {
  return benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(args)...)->MinTime(min_time);
}

void RegisterAll() {
  Register("BM_CasLoop", BM_CasLoop);
  Threads12(Register("BM_SharedCasLoop", BM_SharedCasLoop));
  Register("BM_ClockNow", BM_ClockNow);
  Register("BM_CoarseClockNow", BM_CoarseClockNow);
  Register("BM_MemoryChase", BM_MemoryChase);
  Threads12(Register("BM_TopKeysAdd/hot", BM_TopKeysAdd, true));
  Threads12(Register("BM_TopKeysAdd/100k", BM_TopKeysAdd, false));
  for (const AlgoSpec& spec : kAllAlgorithms) {
    Register(std::string("BM_Decide/") + spec.name, BM_Decide, spec);
  }
  for (const AlgoSpec& spec : kAllAlgorithms) {
    Threads12(
        Register(std::string("BM_StoreHotKey/") + spec.name, BM_StoreHotKey, spec, KeySet::kHot));
  }
  for (const AlgoSpec& spec : kKeyAlgorithms) {
    Threads12(Register(std::string("BM_StoreHotKeyPassing/") + spec.name, BM_StoreHotKey, spec,
                       KeySet::kHotPassing));
  }
  Threads12(Register("BM_LimiterHotKey/gcra", BM_LimiterHotKey, false));
  Threads12(Register("BM_LimiterHotKey/gcra/coarse_clock", BM_LimiterHotKey, true));
  for (const AlgoSpec& spec : kKeyAlgorithms) {
    Threads12(Register(std::string("BM_StoreDistinctKeys/") + spec.name, BM_StoreDistinctKeys, spec,
                       KeySet::kDistinct));
    Threads12(Register(std::string("BM_StoreDistinctKeysDenied/") + spec.name, BM_StoreDistinctKeys,
                       spec, KeySet::kDistinctDenied));
    Threads12(Register(std::string("BM_StoreDistinctKeysShared/") + spec.name, BM_StoreDistinctKeys,
                       spec, KeySet::kDistinctShared));
    Register(std::string("BM_StoreDistinctKeysAlone/") + spec.name, BM_StoreDistinctKeysAlone, spec)
        ->UseRealTime();
  }
  Threads12(Register("BM_StoreOwnKey/gcra", BM_StoreOwnKey, kKeyAlgorithms[0]));
  Threads12(Register("BM_StoreDistinctShards/gcra", BM_StoreDistinctShards, kKeyAlgorithms[0]));
  Threads12(Register("BM_StoreNewKeys/gcra", BM_StoreNewKeys, kKeyAlgorithms[0]));
  for (KeySet set : {KeySet::k100k, KeySet::k10M}) {
    const std::string size = set == KeySet::k10M ? "10M" : "100k";
    Register("BM_MapFloor" + size + "/clock", BM_MapFloor, set, TimeSource::kClock, false)
        ->UseRealTime();
    Register("BM_MapFloor" + size + "/time_in", BM_MapFloor, set, TimeSource::kPassed, false)
        ->UseRealTime();
    Register("BM_MapFloor" + size + "/time_in_atomics", BM_MapFloor, set, TimeSource::kPassed, true)
        ->UseRealTime();
    // Per algorithm, its runs together: a 10M fixture is built once for them.
    for (const AlgoSpec& spec : kKeyAlgorithms) {
      Threads12(Register("BM_StoreRandom" + size + "/" + spec.name, BM_StoreRandom, spec, set,
                         TimeSource::kClock));
      // Time included at the cost of a relaxed load (issue 17's lever for
      // the clock read), before the time-in run moves the states ahead.
      if (set == KeySet::k100k) {
        Register("BM_StoreRandom100k/" + std::string(spec.name) + "/coarse_clock", BM_StoreRandom,
                 spec, set, TimeSource::kCoarse)
            ->UseRealTime();
      }
      Register("BM_StoreRandom" + size + "TimeIn/" + spec.name, BM_StoreRandom, spec, set,
               TimeSource::kPassed)
          ->UseRealTime();
    }
  }
  // The sliding window at 100k keys too: one word where its limit packs
  // (RandomKeysLimit's does), beside the others' time-in runs.
  Register("BM_StoreRandom100kTimeIn/sliding_window", BM_StoreRandom, kSlidingWindow, KeySet::k100k,
           TimeSource::kPassed)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--benchmark_min_time=", 0) == 0) min_time = std::stod(arg.substr(21));
  }
  RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
