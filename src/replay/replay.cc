// The replay loop: one line, one request, every applying policy decides
// (policy::Evaluate, the server's evaluation, of that policy alone). Per
// line the work is the parse, the path normalization the server does, one
// Matches per policy, KeyFor, the evaluation and one hash-map update for the
// report; bench/sim_bench.cc measures lines per second.
#include "replay/replay.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "base/ascii.h"
#include "base/cat.h"
#include "metrics/metrics.h"
#include "policy/evaluation.h"
#include "policy/policy_set.h"
#include "policy/request_text.h"
#include "sluice/clock.h"
#include "sluice/store/memory_store.h"

namespace sluice::replay {
namespace {

using internal::Cat;
using policy::Policy;
using policy::PolicySet;
using policy::RequestFacts;

constexpr int64_t kSteps = 10;  // steps per period for the per-key peaks
constexpr int64_t kMinuteUs = 60'000'000;

// The most requests in any window of one period, over windows that start
// on a step (a tenth of the period): a ring of the last ten steps' counts.
struct PeakCounter {
  int64_t step = std::numeric_limits<int64_t>::min();  // the newest step's index
  std::array<uint32_t, kSteps> counts{};
  uint32_t sum = 0;
  uint32_t peak = 0;

  void Add(int64_t t_us, int64_t step_us) {
    const int64_t index = t_us / step_us;
    if (index != step) {
      if (step == std::numeric_limits<int64_t>::min() || index - step >= kSteps) {
        counts.fill(0);
        sum = 0;
      } else {
        for (int64_t i = step + 1; i <= index; ++i) {  // steps that fell out of the window
          uint32_t& old = counts[static_cast<size_t>(i % kSteps)];
          sum -= old;
          old = 0;
        }
      }
      step = index;
    }
    ++counts[static_cast<size_t>(index % kSteps)];
    ++sum;
    peak = std::max(peak, sum);
  }
};

struct KeyStats {
  int64_t requests = 0;
  int64_t limited = 0;
  int64_t first_limited_us = 0;
  int64_t last_limited_us = 0;
  size_t peaks = 0;  // index of its first PeakCounter
};

struct PolicyState {
  const Policy* policy = nullptr;
  bool every_line = false;
  std::vector<Duration> periods;  // distinct, ascending
  std::vector<int64_t> step_us;
  absl::flat_hash_map<std::string, KeyStats> keys;
  std::vector<PeakCounter> peaks;  // keys.size() x periods.size()
  absl::flat_hash_map<int64_t, int64_t> limited_minutes;
  PolicyReport report;
};

std::string DescribeMatch(const MatchConfig& m) {
  std::string out;
  auto add = [&](std::string_view s) { out += Cat(out.empty() ? "" : ", ", s); };
  if (m.path) add(Cat("path ", *m.path));
  if (m.path_prefix) add(Cat("path_prefix ", *m.path_prefix));
  if (m.method) add(Cat("method ", *m.method));
  if (m.host) add(Cat("host ", *m.host));
  for (const std::string& h : m.headers) add(Cat("header ", h));
  return out.empty() ? "every request" : out;
}

// The value at quantile q of sorted values: the smallest v with at least
// q of them <= v.
int64_t Quantile(const std::vector<uint32_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size()) - 1e-9);
  if (static_cast<double>(rank) < q * static_cast<double>(sorted.size()) - 1e-9) ++rank;  // ceil
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

void Finish(PolicyState& s, size_t top) {
  PolicyReport& r = s.report;
  r.keys = static_cast<int64_t>(s.keys.size());
  std::vector<std::pair<const std::string*, const KeyStats*>> limited;
  for (const auto& [key, stats] : s.keys) {
    if (stats.limited > 0) limited.emplace_back(&key, &stats);
  }
  r.limited_keys = static_cast<int64_t>(limited.size());
  std::sort(limited.begin(), limited.end(), [](const auto& a, const auto& b) {
    if (a.second->limited != b.second->limited) return a.second->limited > b.second->limited;
    return *a.first < *b.first;
  });
  for (size_t i = 0; i < limited.size() && i < top; ++i) {
    const KeyStats& k = *limited[i].second;
    r.top.push_back({*limited[i].first, k.requests, k.limited,
                     Time::FromUnixMicros(k.first_limited_us),
                     Time::FromUnixMicros(k.last_limited_us)});
  }
  std::vector<MinuteCount> minutes;
  for (const auto& [minute, count] : s.limited_minutes) {
    minutes.push_back({Time::FromUnixMicros(minute * kMinuteUs), count});
  }
  std::sort(minutes.begin(), minutes.end(), [](const MinuteCount& a, const MinuteCount& b) {
    return a.limited != b.limited ? a.limited > b.limited : a.minute < b.minute;
  });
  if (minutes.size() > 5) minutes.resize(5);
  r.busiest_minutes = minutes;

  const size_t n = s.periods.size();
  for (size_t j = 0; j < n; ++j) {
    std::vector<uint32_t> peaks;
    peaks.reserve(s.keys.size());
    for (const auto& [key, stats] : s.keys) peaks.push_back(s.peaks[stats.peaks + j].peak);
    std::sort(peaks.begin(), peaks.end());
    PeriodSuggestion sug{.period = s.periods[j], .keys = static_cast<int64_t>(peaks.size())};
    sug.p50 = Quantile(peaks, 0.5);
    sug.p99 = Quantile(peaks, 0.99);
    sug.p999 = Quantile(peaks, 0.999);
    sug.max = peaks.empty() ? 0 : peaks.back();
    for (const LimitSpec& l : s.policy->config().limits) {
      if (l.options.rate.period == s.periods[j]) {
        sug.current =
            sug.current ? std::min(*sug.current, l.options.rate.limit) : l.options.rate.limit;
      }
    }
    if (sug.current) {
      sug.keys_over_current = static_cast<int64_t>(
          peaks.end() -
          std::upper_bound(peaks.begin(), peaks.end(),
                           static_cast<uint32_t>(std::min<int64_t>(*sug.current, UINT32_MAX))));
    }
    r.suggestions.push_back(sug);
  }
}

}  // namespace

absl::StatusOr<ReplayReport> Replay(const Config& config, LineReader& in,
                                    const ReplayOptions& options) {
  // The policies, built as `sluice serve` builds them, on a manual clock.
  // Local and global limits alike keep their state in one memory store: a
  // log holds the traffic of the whole fleet, so one state per limit is what
  // a global (shared) limit sees, and a local limit sees what one instance
  // would if it had served the whole log.
  ManualClock clock;
  MemoryStore store({.max_keys = config.store.max_keys, .on_full = config.store.on_full});
  metrics::Metrics metrics;
  absl::StatusOr<std::shared_ptr<const PolicySet>> set =
      PolicySet::Create(config, store, &store, clock, /*previous=*/nullptr, metrics);
  if (!set.ok()) return set.status();
  for (const std::string& name : options.apply) {
    if ((*set)->Find(name) == nullptr) {
      return absl::InvalidArgumentError(
          Cat("--policy ", name, ": no such policy in ", config.source));
    }
  }

  ReplayReport report;
  report.config = config.source;
  std::vector<PolicyState> states;
  for (const Policy& p : (*set)->policies()) {
    const bool every_line =
        std::find(options.apply.begin(), options.apply.end(), p.name()) != options.apply.end();
    if (!every_line && !p.config().match) {
      report.skipped.push_back(p.name());
      continue;
    }
    PolicyState s;
    s.policy = &p;
    s.every_line = every_line;
    for (const LimitSpec& l : p.config().limits) s.periods.push_back(l.options.rate.period);
    std::sort(s.periods.begin(), s.periods.end());
    s.periods.erase(std::unique(s.periods.begin(), s.periods.end()), s.periods.end());
    for (Duration d : s.periods) s.step_us.push_back(std::max<int64_t>(1, d.micros() / kSteps));
    s.report.name = p.name();
    for (const LimitSpec& l : p.config().limits) {
      s.report.limits += Cat(s.report.limits.empty() ? "" : "; ", DescribeLimit(l.options));
    }
    s.report.applies = every_line ? "every line (--policy)" : DescribeMatch(*p.config().match);
    states.push_back(std::move(s));
  }

  LogParser parser(options.format, options.fields);
  LogRecord record;
  std::string path, host;
  int64_t latest_us = std::numeric_limits<int64_t>::min();
  const std::vector<Cidr>& trusted = config.trusted_proxies;
  RequestFacts facts;
  facts.header = [&record](std::string_view name) { return record.Header(name); };
  std::vector<policy::Applied> one(1);

  std::string_view line;
  while (in.Next(line)) {
    ++report.lines;
    if (options.progress && (report.lines & 0xffff) == 0) options.progress(in, report.lines);
    const LineError error = in.too_long() ? LineError::kTooLong : parser.Parse(line, record);
    if (error == LineError::kEmpty) continue;
    if (error != LineError::kNone) {
      ++report.broken;
      ++report.broken_by_reason[static_cast<size_t>(error)];
      if (report.first_broken_lines.size() < 5)
        report.first_broken_lines.push_back(in.line_number());
      continue;
    }
    ++report.requests;
    int64_t t = record.time.unix_micros();
    if (t < latest_us) {
      ++report.out_of_order;
      report.max_lateness = std::max(report.max_lateness, Duration::Micros(latest_us - t));
      t = latest_us;  // a limiter's time never goes back
    }
    latest_us = t;
    const Time now = Time::FromUnixMicros(t);
    if (!report.first_time) report.first_time = now;
    report.last_time = now;
    clock.Set(now);

    // The request as the server sees it (server.cc's Facts).
    const std::string_view raw_path = policy::TargetPath(record.target);
    path = policy::NormalizePath(raw_path);
    std::string_view h = record.host;
    if (h.empty()) {
      if (auto header_host = record.Header("host")) h = *header_host;
    }
    if (!h.empty() && h.front() == '[') {
      h = h.substr(0, h.find(']') + 1);
    } else if (const size_t colon = h.find(':'); colon != std::string_view::npos) {
      h = h.substr(0, colon);
    }
    host = internal::AsciiLower(h);
    facts.method = record.method;
    facts.path = path;
    facts.raw_path = raw_path;
    facts.query = policy::TargetQuery(record.target);
    facts.host = host;
    facts.peer_ip = record.ip;
    const RouteConfig* route = (*set)->RouteFor(facts);
    const std::string_view route_name =
        route != nullptr ? std::string_view(route->name) : std::string_view();

    // Each applying policy decides alone (policy::Evaluate of that one
    // policy): the report says what each would have limited.
    for (PolicyState& s : states) {
      if (!s.every_line && !policy::Matches(*s.policy->config().match, facts)) continue;
      PolicyReport& r = s.report;
      ++r.requests;
      one[0] = {.policy = s.policy,
                .key = s.policy->KeyFor(facts, route_name, trusted, config.real_ip_header)};
      if (!one[0].key) {
        ++r.missing_key;
        continue;
      }
      const policy::Verdict verdict = policy::EvaluateNow(one, now);  // a memory store: in process
      const policy::Answer& answer = verdict.answers[0];
      if (!answer.error.ok()) {
        ++r.key_errors;
        continue;
      }
      const bool limited = !answer.decision.allowed;
      if (!limited) {
        ++r.allowed;
        if (answer.decision.delay > Duration::Zero()) ++r.delayed;
      } else {
        ++r.limited;
        if (!r.first_limited) r.first_limited = now;
        r.last_limited = now;
        ++s.limited_minutes[t / kMinuteUs];
      }
      auto it = s.keys.find(*one[0].key);
      if (it == s.keys.end()) {
        if (static_cast<int64_t>(s.keys.size()) >= options.max_keys) {
          ++r.untracked_requests;
          continue;
        }
        it = s.keys.emplace(*std::move(one[0].key), KeyStats{.peaks = s.peaks.size()}).first;
        s.peaks.resize(s.peaks.size() + s.periods.size());
      }
      KeyStats& k = it->second;
      ++k.requests;
      if (limited) {
        if (k.limited == 0) k.first_limited_us = t;
        ++k.limited;
        k.last_limited_us = t;
      }
      for (size_t j = 0; j < s.periods.size(); ++j) s.peaks[k.peaks + j].Add(t, s.step_us[j]);
    }
  }
  if (options.progress) options.progress(in, report.lines);
  if (!in.status().ok()) report.input_error = std::string(in.status().message());
  report.format = parser.format();
  for (PolicyState& s : states) {
    Finish(s, options.top);
    report.policies.push_back(std::move(s.report));
  }
  return report;
}

namespace {

std::string Percent(int64_t part, int64_t whole) {
  if (whole == 0) return "0%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string Unit(Duration period) {
  // "s", "min", "h" for one unit, else the duration ("10/5s").
  if (period == Duration::Seconds(1)) return "s";
  if (period == Duration::Minutes(1)) return "min";
  if (period == Duration::Hours(1)) return "h";
  if (period == Duration::Days(1)) return "day";
  return FormatDuration(period);
}

std::string_view FormatName(LogFormat f) {
  return f == LogFormat::kJson ? "json" : f == LogFormat::kCombined ? "combined" : "auto";
}

}  // namespace

std::string FormatReplayText(const ReplayReport& r) {
  std::string out =
      Cat("replay of ", r.log, " (", FormatName(r.format), ") through ", r.config, "\n");
  out += Cat("lines ", r.lines, ": ", r.requests, " requests, ", r.broken, " broken");
  if (r.broken > 0) {
    std::string reasons;
    for (size_t i = 0; i < r.broken_by_reason.size(); ++i) {
      if (r.broken_by_reason[i] == 0) continue;
      reasons += Cat(reasons.empty() ? "" : ", ", LineErrorName(static_cast<LineError>(i)), " ",
                     r.broken_by_reason[i]);
    }
    std::string lines;
    for (int64_t n : r.first_broken_lines) lines += Cat(lines.empty() ? "" : ", ", n);
    out += Cat(" (", reasons, "; first at line ", lines, ")");
  }
  out += Cat(", ", r.out_of_order, " out of order");
  if (r.out_of_order > 0)
    out += Cat(" (at most ", FormatDuration(r.max_lateness),
               " late, decided at the latest time seen)");
  out += "\n";
  if (r.first_time) {
    out += Cat("time ", FormatUtc(*r.first_time), " to ", FormatUtc(*r.last_time), " (",
               FormatDuration(*r.last_time - *r.first_time), ")\n");
  }
  if (!r.input_error.empty()) out += Cat("input ended early: ", r.input_error, "\n");
  for (const std::string& name : r.skipped) {
    out += Cat("policy ", name, ": no match (decision API only), not replayed; --policy ", name,
               " applies it to every line\n");
  }
  for (const PolicyReport& p : r.policies) {
    out += Cat("\npolicy ", p.name, ": ", p.limits, "\n  applies to: ", p.applies, "\n");
    out += Cat("  requests ", p.requests, " from ", p.keys, p.keys == 1 ? " key" : " keys",
               "; limited ", p.limited, " (", Percent(p.limited, p.requests), ") from ",
               p.limited_keys, p.limited_keys == 1 ? " key" : " keys");
    if (p.delayed > 0) out += Cat("; delayed ", p.delayed);
    if (p.missing_key > 0) out += Cat("; denied for a missing key part ", p.missing_key);
    if (p.key_errors > 0) out += Cat("; keys refused (too long) ", p.key_errors);
    if (p.untracked_requests > 0) out += Cat("; beyond the tracked keys ", p.untracked_requests);
    out += "\n";
    if (p.first_limited) {
      out += Cat("  first limited ", FormatUtc(*p.first_limited), ", last ",
                 FormatUtc(*p.last_limited), "\n");
      out += "  most limited minutes:";
      for (const MinuteCount& m : p.busiest_minutes)
        out += Cat(" ", FormatUtc(m.minute), " (", m.limited, ")");
      out += "\n";
    }
    if (!p.top.empty()) {
      size_t width = 3;
      for (const KeyReport& k : p.top) width = std::max(width, k.key.size());
      width = std::min<size_t>(width, 48);
      char buf[256];
      std::snprintf(buf, sizeof buf, "  %-*s %10s %10s  %-20s  %s\n", static_cast<int>(width),
                    "key", "requests", "limited", "first limited", "last limited");
      out += Cat("  top offenders:\n", buf);
      for (const KeyReport& k : p.top) {
        std::string key = k.key.size() > width ? k.key.substr(0, width - 3) + "..." : k.key;
        std::snprintf(buf, sizeof buf, "  %-*s %10" PRId64 " %10" PRId64 "  %-20s  %s\n",
                      static_cast<int>(width), key.c_str(), k.requests, k.limited,
                      FormatUtc(k.first_limited).c_str(), FormatUtc(k.last_limited).c_str());
        out += buf;
      }
    }
    if (!p.suggestions.empty()) {
      out +=
          "  per-key peaks (most requests in any window of one period) and the limit that lets\n"
          "  99.9% of keys through untouched:\n";
      char buf[256];
      std::snprintf(buf, sizeof buf, "  %8s %8s %8s %8s %8s  %-12s %s\n", "period", "p50", "p99",
                    "p99.9", "max", "suggested", "current");
      out += buf;
      for (const PeriodSuggestion& s : p.suggestions) {
        const std::string suggested = Cat(std::max<int64_t>(1, s.p999), "/", Unit(s.period));
        std::string current = "-";
        if (s.current) {
          current = Cat(*s.current, "/", Unit(s.period), " (", s.keys_over_current,
                        s.keys_over_current == 1 ? " key" : " keys", " above it)");
        }
        std::snprintf(buf, sizeof buf,
                      "  %8s %8" PRId64 " %8" PRId64 " %8" PRId64 " %8" PRId64 "  %-12s %s\n",
                      FormatDuration(s.period).c_str(), s.p50, s.p99, s.p999, s.max,
                      suggested.c_str(), current.c_str());
        out += buf;
      }
    }
  }
  return out;
}

std::string FormatReplayJson(const ReplayReport& r) {
  using Json = nlohmann::ordered_json;
  Json root;
  root["log"] = r.log;
  root["config"] = r.config;
  root["format"] = FormatName(r.format);
  root["lines"] = r.lines;
  root["requests"] = r.requests;
  Json broken;
  broken["total"] = r.broken;
  for (size_t i = 0; i < r.broken_by_reason.size(); ++i) {
    const auto e = static_cast<LineError>(i);
    if (e == LineError::kNone || e == LineError::kEmpty) continue;
    static constexpr std::string_view kKeys[] = {
        "", "", "too_long", "syntax", "time", "request_line", "address"};
    static_assert(std::size(kKeys) == static_cast<size_t>(LineError::kCount));
    broken[std::string(kKeys[i])] = r.broken_by_reason[i];
  }
  broken["first_lines"] = r.first_broken_lines;
  root["broken"] = broken;
  root["out_of_order"] = r.out_of_order;
  root["max_lateness_ms"] = static_cast<double>(r.max_lateness.micros()) / 1000.0;
  root["first_time"] = r.first_time ? Json(FormatUtc(*r.first_time)) : Json();
  root["last_time"] = r.last_time ? Json(FormatUtc(*r.last_time)) : Json();
  if (!r.input_error.empty()) root["input_error"] = r.input_error;
  root["skipped_policies"] = r.skipped;
  Json policies = Json::array();
  for (const PolicyReport& p : r.policies) {
    Json j;
    j["name"] = p.name;
    j["limits"] = p.limits;
    j["applies"] = p.applies;
    j["requests"] = p.requests;
    j["allowed"] = p.allowed;
    j["limited"] = p.limited;
    j["delayed"] = p.delayed;
    j["missing_key"] = p.missing_key;
    j["key_errors"] = p.key_errors;
    j["keys"] = p.keys;
    j["limited_keys"] = p.limited_keys;
    j["untracked_requests"] = p.untracked_requests;
    j["first_limited"] = p.first_limited ? Json(FormatUtc(*p.first_limited)) : Json();
    j["last_limited"] = p.last_limited ? Json(FormatUtc(*p.last_limited)) : Json();
    Json minutes = Json::array();
    for (const MinuteCount& m : p.busiest_minutes)
      minutes.push_back({{"minute", FormatUtc(m.minute)}, {"limited", m.limited}});
    j["busiest_minutes"] = minutes;
    Json top = Json::array();
    for (const KeyReport& k : p.top) {
      top.push_back({{"key", k.key},
                     {"requests", k.requests},
                     {"limited", k.limited},
                     {"first_limited", FormatUtc(k.first_limited)},
                     {"last_limited", FormatUtc(k.last_limited)}});
    }
    j["top"] = top;
    Json suggestions = Json::array();
    for (const PeriodSuggestion& s : p.suggestions) {
      Json sj{{"period", FormatDuration(s.period)},
              {"keys", s.keys},
              {"p50", s.p50},
              {"p99", s.p99},
              {"p99_9", s.p999},
              {"max", s.max},
              {"suggested", Cat(std::max<int64_t>(1, s.p999), "/", FormatDuration(s.period))}};
      if (s.current) {
        sj["current_limit"] = *s.current;
        sj["keys_over_current"] = s.keys_over_current;
      }
      suggestions.push_back(sj);
    }
    j["suggestions"] = suggestions;
    policies.push_back(j);
  }
  root["policies"] = policies;
  return root.dump(2) + "\n";
}

}  // namespace sluice::replay
