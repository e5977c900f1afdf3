// Metrics: counters, gauges and one latency histogram, written out in the
// Prometheus text format. Internal: the server, the Envoy services and replay count with it.
//
// Thread-safety: all methods from any thread. A counter, once created, lives
// as long as the Metrics; callers may keep the pointer (the hot path does).
//
// Counters and the histogram are split into per-thread slots, each on its own
// cache line, summed when read: with one shared atomic, every request on
// every event loop would pull the same lines from the other cores, several
// times per request.
#ifndef SLUICE_METRICS_METRICS_H_
#define SLUICE_METRICS_METRICS_H_

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

namespace sluice::metrics {

inline constexpr int kMetricSlots = 16;
// This thread's slot, handed out round-robin on first use.
int ThisThreadSlot();

// Also used as a gauge (Add(-1)); value() is exact once adds have stopped.
class Counter {
 public:
  void Add(int64_t n = 1) {
    slots_[ThisThreadSlot()].value.fetch_add(n, std::memory_order_relaxed);
  }
  int64_t value() const {
    int64_t sum = 0;
    for (const Slot& s : slots_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  struct alignas(64) Slot {
    std::atomic<int64_t> value{0};
  };
  std::array<Slot, kMetricSlots> slots_{};
};

// Latency in microseconds, cumulative buckets as Prometheus expects.
class Histogram {
 public:
  static constexpr std::array<int64_t, 12> kBoundsUs = {1,   5,   10,   25,   50,    100,
                                                        250, 500, 1000, 5000, 25000, 100000};
  void Observe(int64_t us);
  void Write(const std::string& name, std::string& out) const;

 private:
  struct alignas(64) Slot {
    std::array<std::atomic<int64_t>, kBoundsUs.size() + 1> buckets{};
    std::atomic<int64_t> sum_us{0};
  };
  std::array<Slot, kMetricSlots> slots_{};
};

class Metrics {
 public:
  // A counter by name and label set, e.g.
  // Get("sluice_decisions_total", {{"policy", "login"}, {"outcome", "denied"}}).
  Counter* Get(const std::string& name,
               const std::vector<std::pair<std::string, std::string>>& labels);
  Histogram& decision_latency() { return decision_latency_; }
  Counter& in_flight() { return in_flight_; }
  Counter& connections() { return connections_; }
  Counter& admin_connections() { return admin_connections_; }
  Counter& decision_connections() { return decision_connections_; }

  // Gauges read when /metrics is served (keys held, forced evictions, ...).
  void AddGauge(std::string name, std::string help, std::string type,
                std::function<int64_t()> read);

  void SetHelp(const std::string& name, std::string help);
  // The `# TYPE` of a name's Get() series: "counter" unless set here
  // ("gauge" for those moved both ways with Add(-1)).
  void SetType(const std::string& name, std::string type);
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, Counter*>> counters_;  // name -> labels -> counter
  std::map<std::string, std::string> help_;
  std::map<std::string, std::string> types_;
  std::deque<Counter> storage_;
  struct Gauge {
    std::string name, help, type;
    std::function<int64_t()> read;
  };
  std::vector<Gauge> gauges_;
  Histogram decision_latency_;
  Counter in_flight_;
  Counter connections_;
  Counter admin_connections_;
  Counter decision_connections_;
};

// Prometheus label value escaping: backslash, quote, newline.
std::string EscapeLabel(std::string_view value);

}  // namespace sluice::metrics

#endif  // SLUICE_METRICS_METRICS_H_
