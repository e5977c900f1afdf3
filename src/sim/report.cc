#include "sim/report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "base/cat.h"

namespace sluice::sim {
namespace {

using internal::Cat;

std::string Fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

double Millis(Duration d) { return static_cast<double>(d.micros()) / 1000.0; }

// "0", "750us", "25ms", "9.98s", "541s": short, for a table cell.
std::string Short(Duration d) {
  const int64_t us = d.micros();
  if (us == 0) return "0";
  if (us < 1000) return Cat(us, "us");
  if (us < 1'000'000) return Fixed(static_cast<double>(us) / 1e3, us % 1000 == 0 ? 0 : 1) + "ms";
  if (us < 100'000'000) return Fixed(static_cast<double>(us) / 1e6, 2) + "s";
  return Fixed(static_cast<double>(us) / 1e6, 0) + "s";
}

// Whether requests take time: a downstream serves them, or a service time.
bool Serves(const Result& result) {
  return result.downstream.has_value() || result.service_time.has_value();
}

// A run limited by concurrency alone has no rate to measure against.
bool HasContract(const LimiterRun& r) { return r.contract.period > Duration::Zero(); }

double Ratio(const LimiterRun& r) {
  return r.contract.limit > 0
             ? static_cast<double>(r.max_admitted_period) / static_cast<double>(r.contract.limit)
             : 0;
}

// One metric: its name in CSV and JSON, its label in the text table, and its
// value as a table cell, a CSV field and a JSON value.
struct Metric {
  std::string_view name;
  std::string_view label;
  std::function<std::string(const LimiterRun&)> text;
  std::function<nlohmann::ordered_json(const LimiterRun&)> json;
  bool downstream_only = false;
  bool served_only = false;  // shown when requests take time (a downstream or a service time)
};

Metric Count(std::string_view name, std::string_view label, int64_t LimiterRun::*field,
             bool downstream_only = false) {
  return {name, label, [field](const LimiterRun& r) { return Cat(r.*field); },
          [field](const LimiterRun& r) { return nlohmann::ordered_json(r.*field); },
          downstream_only};
}

Metric Span(std::string_view name, std::string_view label,
            std::function<Duration(const LimiterRun&)> get, bool downstream_only = false) {
  return {name, label, [get](const LimiterRun& r) { return Short(get(r)); },
          [get](const LimiterRun& r) { return nlohmann::ordered_json(Millis(get(r))); },
          downstream_only};
}

const std::vector<Metric>& Metrics() {
  static const std::vector<Metric> metrics = {
      Count("requests", "requests (first tries)", &LimiterRun::requests),
      Count("offered", "offered (tries + retries)", &LimiterRun::offered),
      Count("retries", "retries", &LimiterRun::retries),
      Count("admitted", "admitted", &LimiterRun::admitted),
      Count("rejected", "rejected", &LimiterRun::rejected),
      Count("delayed", "delayed (shaped)", &LimiterRun::delayed),
      Count("served", "requests served", &LimiterRun::served),
      Count("gave_up", "requests given up", &LimiterRun::gave_up),
      Count("unfinished", "still retrying at the end", &LimiterRun::unfinished),
      Count("dropped", "dropped by downstream queue", &LimiterRun::dropped, true),
      Count("max_admitted_1s", "most admitted, any 1s", &LimiterRun::max_admitted_1s),
      {"max_admitted_period", "most admitted, any period",
       [](const LimiterRun& r) {
         if (!HasContract(r)) return std::string("-");
         return Cat(r.max_admitted_period, " per ", FormatRate(r.contract));
       },
       [](const LimiterRun& r) {
         return HasContract(r) ? nlohmann::ordered_json(r.max_admitted_period)
                               : nlohmann::ordered_json();
       }},
      {"contract", "", nullptr,
       [](const LimiterRun& r) {
         return HasContract(r) ? nlohmann::ordered_json(FormatRate(r.contract))
                               : nlohmann::ordered_json();
       }},
      {"period_ratio", "  x the contract",
       [](const LimiterRun& r) {
         return HasContract(r) ? Fixed(Ratio(r), 2) + "x" : std::string("-");
       },
       [](const LimiterRun& r) {
         return HasContract(r) ? nlohmann::ordered_json(std::round(Ratio(r) * 1000) / 1000)
                               : nlohmann::ordered_json();
       }},
      {"admitted_cv", "unevenness (cv per s)",
       [](const LimiterRun& r) { return Fixed(r.admitted_cv, 3); },
       [](const LimiterRun& r) {
         return nlohmann::ordered_json(std::round(r.admitted_cv * 1000) / 1000);
       }},
      Span("delay_p50_ms", "delay p50", [](const LimiterRun& r) { return r.delay.p50; }),
      Span("delay_p99_ms", "delay p99", [](const LimiterRun& r) { return r.delay.p99; }),
      Span("delay_max_ms", "delay max", [](const LimiterRun& r) { return r.delay.max; }),
      Span("latency_p50_ms", "first try to served, p50",
           [](const LimiterRun& r) { return r.latency.p50; }),
      Span("latency_p99_ms", "first try to served, p99",
           [](const LimiterRun& r) { return r.latency.p99; }),
      {"served_by_ms", "backlog served by",
       [](const LimiterRun& r) { return r.served_by ? Short(*r.served_by) : std::string("-"); },
       [](const LimiterRun& r) {
         return r.served_by ? nlohmann::ordered_json(Millis(*r.served_by))
                            : nlohmann::ordered_json();
       }},
      Count("peak_arrivals_1s", "peak arrivals per s", &LimiterRun::peak_arrivals_1s),
      Count("peak_retries_1s", "peak retries per s", &LimiterRun::peak_retries_1s),
      Span("retry_wave_ms", "retry wave lasts", [](const LimiterRun& r) { return r.retry_wave; }),
      Count("peak_backlog", "downstream peak backlog", &LimiterRun::peak_backlog, true),
      Span(
          "max_queue_wait_ms", "downstream longest wait",
          [](const LimiterRun& r) { return r.max_queue_wait; }, true),
      {"peak_in_flight", "peak in flight (one key)",
       [](const LimiterRun& r) { return Cat(r.peak_in_flight); },
       [](const LimiterRun& r) { return nlohmann::ordered_json(r.peak_in_flight); }, false, true},
  };
  return metrics;
}

std::string Setting(const Result& result) {
  std::string out = Cat("seed ", result.seed, ", ", FormatDuration(result.duration), ", ",
                        result.instances, result.instances == 1 ? " instance" : " instances");
  if (result.downstream) {
    out += Cat(", downstream ", FormatRate(result.downstream->capacity));
    if (result.downstream->queue > 0) out += Cat(" (queue ", result.downstream->queue, ")");
  } else if (result.service_time) {
    const ServiceTime& t = *result.service_time;
    out += t.kind == ServiceTime::Kind::kConstant ? Cat(", service time ", FormatDuration(t.a))
           : t.kind == ServiceTime::Kind::kExponential
               ? Cat(", service time exponential, mean ", FormatDuration(t.a))
               : Cat(", service time uniform ", FormatDuration(t.a), "..", FormatDuration(t.b));
  } else {
    out += ", no downstream";
  }
  return out;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

std::string FormatText(const Result& result) {
  std::string out = Cat(result.scenario, ": ", result.description, "\n", Setting(result), "\n");
  std::vector<const Metric*> rows;
  for (const Metric& m : Metrics()) {
    if (m.text == nullptr || (m.downstream_only && !result.downstream) ||
        (m.served_only && !Serves(result)))
      continue;
    rows.push_back(&m);
  }
  size_t label_width = 0;
  for (const Metric* m : rows) label_width = std::max(label_width, m->label.size());
  // Columns in blocks that fit in 120 characters.
  constexpr size_t kWidth = 120;
  size_t begin = 0;
  while (begin < result.runs.size()) {
    size_t end = begin, used = label_width;
    std::vector<size_t> widths;
    while (end < result.runs.size()) {
      size_t w = result.runs[end].name.size();
      for (const Metric* m : rows) w = std::max(w, m->text(result.runs[end]).size());
      if (end > begin && used + 2 + w > kWidth) break;
      widths.push_back(w);
      used += 2 + w;
      ++end;
    }
    out += "\n" + std::string(label_width, ' ');
    for (size_t i = begin; i < end; ++i) {
      const std::string& name = result.runs[i].name;
      out += "  " + std::string(widths[i - begin] - name.size(), ' ') + name;
    }
    out += "\n";
    for (const Metric* m : rows) {
      out += std::string(m->label) + std::string(label_width - m->label.size(), ' ');
      for (size_t i = begin; i < end; ++i) {
        const std::string cell = m->text(result.runs[i]);
        out += "  " + std::string(widths[i - begin] - cell.size(), ' ') + cell;
      }
      out += "\n";
    }
    begin = end;
  }
  // The limits behind each name, where the name does not already say them.
  std::string limits;
  for (const LimiterRun& r : result.runs) {
    if (r.name != r.limits) limits += Cat("  ", r.name, ": ", r.limits, "\n");
  }
  if (!limits.empty()) out += "\nlimits:\n" + limits;
  out +=
      "\nmost admitted, any period: the worst key's most admitted in any interval of one contract\n"
      "period, against the contract; unevenness: standard deviation / mean of admitted per second\n"
      "(0 is an even stream); delay: shaping delay of admitted requests; backlog served by: when\n"
      "the last admitted request completed downstream.\n";
  return out;
}

std::string FormatCsv(const Result& result) {
  std::string out = "scenario,seed,limiter,limits";
  for (const Metric& m : Metrics()) out += Cat(",", m.name);
  out += "\n";
  for (const LimiterRun& r : result.runs) {
    out += Cat(CsvField(result.scenario), ",", result.seed, ",", CsvField(r.name), ",",
               CsvField(r.limits));
    for (const Metric& m : Metrics()) {
      const nlohmann::ordered_json v = m.json(r);
      out += ",";
      if (v.is_string()) {
        out += CsvField(v.get<std::string>());
      } else if (!v.is_null()) {
        out += v.dump();
      }
    }
    out += "\n";
  }
  return out;
}

std::string FormatJson(const Result& result) {
  nlohmann::ordered_json root;
  root["scenario"] = result.scenario;
  root["description"] = result.description;
  root["seed"] = result.seed;
  root["duration_ms"] = Millis(result.duration);
  root["instances"] = result.instances;
  if (result.downstream) {
    root["downstream"] = {{"capacity", FormatRate(result.downstream->capacity)},
                          {"queue", result.downstream->queue}};
  }
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const LimiterRun& r : result.runs) {
    nlohmann::ordered_json run;
    run["name"] = r.name;
    run["limits"] = r.limits;
    nlohmann::ordered_json metrics;
    for (const Metric& m : Metrics()) {
      if ((m.downstream_only && !result.downstream) || (m.served_only && !Serves(result))) continue;
      metrics[std::string(m.name)] = m.json(r);
    }
    run["metrics"] = metrics;
    run["series"] = {{"bucket_ms", Millis(r.series.bucket)},
                     {"offered", r.series.offered},
                     {"admitted", r.series.admitted},
                     {"rejected", r.series.rejected},
                     {"retries", r.series.retries}};
    runs.push_back(run);
  }
  root["runs"] = runs;
  return root.dump(2) + "\n";
}

}  // namespace sluice::sim
