#include "metrics/metrics.h"

#include "base/cat.h"

namespace sluice::metrics {

using internal::Cat;

std::string EscapeLabel(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out.push_back(c);
  }
  return out;
}

int ThisThreadSlot() {
  static std::atomic<int> next{0};
  thread_local const int slot = next.fetch_add(1, std::memory_order_relaxed) % kMetricSlots;
  return slot;
}

void Histogram::Observe(int64_t us) {
  size_t i = 0;
  while (i < kBoundsUs.size() && us > kBoundsUs[i]) ++i;
  Slot& slot = slots_[ThisThreadSlot()];
  slot.buckets[i].fetch_add(1, std::memory_order_relaxed);
  slot.sum_us.fetch_add(us, std::memory_order_relaxed);
}

void Histogram::Write(const std::string& name, std::string& out) const {
  // One pass over the slots first, so the buckets, _sum and _count agree.
  std::array<int64_t, kBoundsUs.size() + 1> buckets{};
  int64_t sum = 0;
  for (const Slot& slot : slots_) {
    for (size_t i = 0; i < buckets.size(); ++i) {
      buckets[i] += slot.buckets[i].load(std::memory_order_relaxed);
    }
    sum += slot.sum_us.load(std::memory_order_relaxed);
  }
  int64_t cumulative = 0;
  for (size_t i = 0; i < kBoundsUs.size(); ++i) {
    cumulative += buckets[i];
    const int64_t us = kBoundsUs[i];
    // le in seconds, exact decimal.
    std::string le = Cat(us / 1'000'000, ".");
    std::string frac = Cat(us % 1'000'000 + 1'000'000).substr(1);
    while (frac.size() > 1 && frac.back() == '0') frac.pop_back();
    le += frac;
    out += Cat(name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  cumulative += buckets[kBoundsUs.size()];
  out += Cat(name, "_bucket{le=\"+Inf\"} ", cumulative, "\n");
  std::string frac = Cat(sum % 1'000'000 + 1'000'000).substr(1);
  out += Cat(name, "_sum ", sum / 1'000'000, ".", frac, "\n");
  out += Cat(name, "_count ", cumulative, "\n");
}

Counter* Metrics::Get(const std::string& name,
                      const std::vector<std::pair<std::string, std::string>>& labels) {
  std::string key;
  for (const auto& [k, v] : labels) {
    if (!key.empty()) key += ",";
    key += Cat(k, "=\"", EscapeLabel(v), "\"");
  }
  std::lock_guard lock(mu_);
  Counter*& slot = counters_[name][key];
  if (slot == nullptr) slot = &storage_.emplace_back();
  return slot;
}

void Metrics::AddGauge(std::string name, std::string help, std::string type,
                       std::function<int64_t()> read) {
  std::lock_guard lock(mu_);
  gauges_.push_back({std::move(name), std::move(help), std::move(type), std::move(read)});
}

void Metrics::SetHelp(const std::string& name, std::string help) {
  std::lock_guard lock(mu_);
  help_[name] = std::move(help);
}

void Metrics::SetType(const std::string& name, std::string type) {
  std::lock_guard lock(mu_);
  types_[name] = std::move(type);
}

std::string Metrics::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, series] : counters_) {
    if (auto it = help_.find(name); it != help_.end())
      out += Cat("# HELP ", name, " ", it->second, "\n");
    const auto type = types_.find(name);
    out += Cat("# TYPE ", name, " ", type == types_.end() ? "counter" : type->second, "\n");
    for (const auto& [labels, counter] : series) {
      out += labels.empty() ? name : Cat(name, "{", labels, "}");
      out += Cat(" ", counter->value(), "\n");
    }
  }
  for (const Gauge& g : gauges_) {
    out += Cat("# HELP ", g.name, " ", g.help, "\n# TYPE ", g.name, " ", g.type, "\n");
    out += Cat(g.name, " ", g.read(), "\n");
  }
  out +=
      "# HELP sluice_requests_in_flight Requests being handled now.\n"
      "# TYPE sluice_requests_in_flight gauge\n";
  out += Cat("sluice_requests_in_flight ", in_flight_.value(), "\n");
  out +=
      "# HELP sluice_connections Open connections, by listener.\n# TYPE sluice_connections gauge\n";
  out += Cat("sluice_connections{listener=\"main\"} ", connections_.value(), "\n");
  out += Cat("sluice_connections{listener=\"admin\"} ", admin_connections_.value(), "\n");
  out += Cat("sluice_connections{listener=\"decision\"} ", decision_connections_.value(), "\n");
  out +=
      "# HELP sluice_decision_duration_seconds Time to decide one request (all its policies).\n"
      "# TYPE sluice_decision_duration_seconds histogram\n";
  decision_latency_.Write("sluice_decision_duration_seconds", out);
  return out;
}

}  // namespace sluice::metrics
