// Metrics: counters, gauges and one latency histogram, written out in the
// Prometheus text format. Internal to the server.
//
// Thread-safety: all methods from any thread. A counter, once created, lives
// as long as the Metrics; callers may keep the pointer (the hot path does:
// one relaxed atomic add per event).
#ifndef SLUICE_SERVER_METRICS_H_
#define SLUICE_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sluice::server {

class Counter {
 public:
  void Add(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Latency in microseconds, cumulative buckets as Prometheus expects.
class Histogram {
 public:
  static constexpr std::array<int64_t, 12> kBoundsUs = {1,    5,    10,    25,    50,     100,
                                                        250,  500,  1000,  5000,  25000,  100000};
  void Observe(int64_t us);
  void Write(const std::string& name, std::string& out) const;

 private:
  std::array<std::atomic<int64_t>, kBoundsUs.size() + 1> buckets_{};
  std::atomic<int64_t> sum_us_{0};
  std::atomic<int64_t> count_{0};
};

class Metrics {
 public:
  // A counter by name and label set, e.g.
  // Get("sluice_decisions_total", {{"policy", "login"}, {"outcome", "denied"}}).
  Counter* Get(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels);
  Histogram& decision_latency() { return decision_latency_; }
  std::atomic<int64_t>& in_flight() { return in_flight_; }
  std::atomic<int64_t>& connections() { return connections_; }
  std::atomic<int64_t>& admin_connections() { return admin_connections_; }

  // Gauges read when /metrics is served (keys held, forced evictions, ...).
  void AddGauge(std::string name, std::string help, std::string type, std::function<int64_t()> read);

  void SetHelp(const std::string& name, std::string help);
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, Counter*>> counters_;  // name -> labels -> counter
  std::map<std::string, std::string> help_;
  std::deque<Counter> storage_;
  struct Gauge {
    std::string name, help, type;
    std::function<int64_t()> read;
  };
  std::vector<Gauge> gauges_;
  Histogram decision_latency_;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> admin_connections_{0};
};

// Prometheus label value escaping: backslash, quote, newline.
std::string EscapeLabel(std::string_view value);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_METRICS_H_
