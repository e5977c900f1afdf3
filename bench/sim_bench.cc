// sluice_bench_sim: the simulator's and the replay's throughput (BENCH.md:
// >= 10M simulated requests per second per core through Decide, >= 1M
// access-log lines per second).
//
//   BM_CasLoop                         baseline, as in micro_bench.cc
//   BM_Sim/<setup>                     one SimulateRun of ~1M requests per
//                                      iteration; items = requests + retries
//   BM_SimFile/api_tiers               one SimulateRun of examples/sim/
//                                      api-tiers.yaml's first limiter
//   BM_Replay/<format>                 one Replay of a 500k-line log per
//                                      iteration; items = lines
//
// Simulated traffic: 1,000 clients, each its own key, at 1M/s in all for
// 1 s (constant arrivals), against one limit of 500/s per key (about half
// of the requests pass after each key's first burst); no retries unless the
// name says so. Every request is one event through the event queue, one Decide on
// the key's state and the measurements (rolling windows, per-second series,
// histograms).
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>

#include "replay/log_reader.h"
#include "replay/replay.h"
#include "sim/engine.h"
#include "sim/scenario_file.h"
#include "sluice/config.h"

namespace {

void BM_CasLoop(benchmark::State& state) {
  std::atomic<int64_t> word{0};
  for (auto _ : state) {
    int64_t v = word.load(std::memory_order_relaxed);
    while (!word.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) {
    }
  }
  benchmark::DoNotOptimize(word.load());
}
BENCHMARK(BM_CasLoop);

std::string SimYaml(std::string_view limiter, std::string_view retry) {
  return std::string(R"(
duration: 1s
clients:
  - name: c
    count: 1000
    retry: )") +
         std::string(retry) + R"(
    traffic: [{constant: 1000000/s}]
limiters:
  - )" + std::string(limiter) +
         "\n";
}

// Runs the scenario's first limiter with `seed` once per iteration.
void RunScenario(benchmark::State& state, const absl::StatusOr<sluice::sim::Scenario>& scenario,
                 uint64_t seed) {
  if (!scenario.ok()) {
    state.SkipWithError(std::string(scenario.status().message()).c_str());
    return;
  }
  int64_t items = 0, admitted = 0;
  for (auto _ : state) {
    absl::StatusOr<sluice::sim::LimiterRun> run = sluice::sim::SimulateRun(*scenario, 0, seed);
    if (!run.ok()) {
      state.SkipWithError(std::string(run.status().message()).c_str());
      return;
    }
    items += run->offered;
    admitted += run->admitted;
    benchmark::DoNotOptimize(run->max_admitted_1s);
  }
  state.SetItemsProcessed(items);
  state.counters["allowed"] =
      items > 0 ? static_cast<double>(admitted) / static_cast<double>(items) : 0;
}

void RunSim(benchmark::State& state, const std::string& yaml) {
  RunScenario(state, sluice::sim::ParseScenario(yaml, "bench", "bench"), 1);
}

#define SIM_BENCH(name, limiter, retry)                                                   \
  void BM_Sim_##name(benchmark::State& state) { RunSim(state, SimYaml(limiter, retry)); } \
  BENCHMARK(BM_Sim_##name)->Name("BM_Sim/" #name)->Unit(benchmark::kMillisecond)

SIM_BENCH(token_bucket, "{algorithm: token_bucket, rate: 500/s, burst: 50}", "never");
SIM_BENCH(gcra, "{algorithm: gcra, rate: 500/s, burst: 50}", "never");
SIM_BENCH(leaky_police, "{algorithm: leaky_bucket, rate: 500/s, burst: 50}", "never");
SIM_BENCH(leaky_shape, "{algorithm: leaky_bucket, mode: shape, rate: 500/s, max_delay: 100ms}",
          "never");
SIM_BENCH(fixed_window, "{algorithm: fixed_window, rate: 500/s}", "never");
SIM_BENCH(sliding_window, "{algorithm: sliding_window, rate: 500/s}", "never");
SIM_BENCH(sliding_log, "{algorithm: sliding_log, rate: 500/s}", "never");
// Every rejected request retries 10 ms later, up to twice: the queue holds
// the thousands of waiting retries.
SIM_BENCH(gcra_retry_fixed, "{algorithm: gcra, rate: 500/s, burst: 50}",
          "{policy: fixed, delay: 10ms, max_attempts: 3}");
// Two limits: through sluice::Limiter on a MemoryStore (keys as strings).
SIM_BENCH(limiter_two_limits,
          "{limits: [{algorithm: gcra, rate: 500/s, burst: 50}, {algorithm: fixed_window, rate: "
          "50000/min}]}",
          "never");

// examples/sim/api-tiers.yaml, its first limiter: a day of 206 clients at
// a few requests a second each, with retries and a downstream. Sparse: most
// of the calendar's 128 us buckets hold one or two events when they come
// up (sluice sim's own example, and its ASan test's).
void BM_SimFile_api_tiers(benchmark::State& state) {
  const absl::StatusOr<sluice::sim::Scenario> scenario =
      sluice::sim::LoadScenarioFile(SLUICE_SOURCE_DIR "/examples/sim/api-tiers.yaml");
  RunScenario(state, scenario, scenario.ok() ? scenario->seed : 0);
}
BENCHMARK(BM_SimFile_api_tiers)->Name("BM_SimFile/api_tiers")->Unit(benchmark::kMillisecond);

// A log of 500k lines from 1,000 addresses, one second apart per 1,000
// lines, half of them to a limited path, written once per format.
std::string LogFile(bool json) {
  const std::string path = std::string("/tmp/sluice_bench_replay.") + (json ? "jsonl" : "log");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  char line[512];
  for (int64_t i = 0; i < 500'000; ++i) {
    const int64_t t = 1'704'067'200 + i / 1000;
    const int ip = static_cast<int>((i * 7919) % 1000);
    const char* path_part = i % 2 == 0 ? "/login" : "/static/app.js";
    if (json) {
      std::snprintf(line, sizeof line,
                    "{\"time\": %lld, \"remote_addr\": \"10.0.%d.%d\", \"method\": \"POST\", "
                    "\"path\": \"%s\", "
                    "\"status\": 200, \"http_user_agent\": \"bench/1.0\"}\n",
                    static_cast<long long>(t), ip / 250, ip % 250, path_part);
    } else {
      const int64_t s = t % 86400;
      std::snprintf(
          line, sizeof line,
          "10.0.%d.%d - - [01/Jan/2024:%02lld:%02lld:%02lld +0000] \"POST %s HTTP/1.1\" 200 512 "
          "\"-\" \"bench/1.0\"\n",
          ip / 250, ip % 250, static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60),
          static_cast<long long>(s % 60), path_part);
    }
    out << line;
  }
  return path;
}

void BM_Replay(benchmark::State& state, bool json) {
  const std::string path = LogFile(json);
  absl::StatusOr<sluice::Config> config = sluice::ParseConfig(R"(
policies:
  - name: login
    match: {path_prefix: /login, method: POST}
    key: [client_ip]
    limits:
      - {algorithm: sliding_window, rate: 60/min}
)",
                                                              "bench.yaml");
  if (!config.ok()) {
    state.SkipWithError(std::string(config.status().message()).c_str());
    return;
  }
  int64_t lines = 0, limited = 0;
  for (auto _ : state) {
    absl::StatusOr<std::unique_ptr<sluice::replay::LineReader>> in =
        sluice::replay::LineReader::Open(path);
    absl::StatusOr<sluice::replay::ReplayReport> report = sluice::replay::Replay(*config, **in, {});
    if (!report.ok()) {
      state.SkipWithError(std::string(report.status().message()).c_str());
      return;
    }
    lines += report->lines;
    limited += report->policies[0].limited;
  }
  state.SetItemsProcessed(lines);
  state.counters["limited"] =
      lines > 0 ? static_cast<double>(limited) / static_cast<double>(lines) : 0;
  std::remove(path.c_str());
}
BENCHMARK_CAPTURE(BM_Replay, combined, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, json, true)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
