// Fuzz target: Envoy quota streams (RLQS v3) as the quota service takes
// them: a run of steps, each one report of one of eight streams (or the
// end of a stream), parsed from the bytes as protobuf, applied as the
// service applies them (ApplyReports: the domain rules, the bounds, the
// bucket cap, QuotaBook::Report), with the shares recomputed after every
// step at a clock the input moves. Besides crashes and sanitizer reports it
// checks the service's promise after every step, on a model of the Envoys
// built from what was sent alone: in every bucket, the assignments that may
// be in force (each until its TTL, or until a newer one has surely arrived,
// the delivery margin after it was sent) sum to at most the limit; and
// every assignment sent is one Envoy can apply (a token bucket with tokens
// and a fill interval no faster than the share, a positive rate). What may
// be in force grows only when something is sent, so checking right after
// each step's sends covers every moment.
//
// A step: one byte (its low 3 bits the stream; the top bit: the stream
// ends), one byte (milliseconds the clock moves, times 20), two bytes (the
// report's length, little-endian), the report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "envoy/quota_book.h"
#include "envoy/rlqs_service.h"

namespace {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;
using sluice::Duration;
using sluice::Rate;
using sluice::Time;
using sluice::envoy::QuotaAction;
using sluice::envoy::QuotaBook;
using sluice::envoy::QuotaOptions;
using sluice::envoy::QuotaStrategy;

QuotaOptions Options() {
  QuotaOptions o;
  o.ttl = Duration::Seconds(2);
  o.delivery_margin = Duration::Millis(500);
  o.abandon_after = Duration::Seconds(10);
  o.max_buckets_per_stream = 16;
  sluice::envoy::QuotaDomain web{.domain = "web"};
  web.rules.push_back({.match = {{"name", "api"}}, .limit = {.rate = {500, Duration::Seconds(1)}}});
  web.rules.push_back({.match = {{"client", "*"}, {"name", "per"}},
                       .limit = {.rate = {20, Duration::Seconds(1)}, .burst = 3}});
  web.rules.push_back({.match = {{"name", "batch"}},
                       .limit = {.rate = {10, Duration::Minutes(1)},
                                 .strategy = QuotaStrategy::kRequestsPerTimeUnit}});
  web.unknown = sluice::envoy::UnknownBucket::kLimit;
  web.unknown_limit = {.rate = {1, Duration::Seconds(1)}};
  o.domains.push_back(web);
  sluice::envoy::QuotaDomain open{.domain = "open"};
  open.unknown = sluice::envoy::UnknownBucket::kAllowAll;
  o.domains.push_back(open);
  return o;
}

[[noreturn]] void Broken(const char* what, double value) {
  std::fprintf(stderr, "rlqs_reports: %s (%f)\n", what, value);
  std::abort();
}

void CheckSend(const QuotaBook::Send& s) {
  const QuotaAction& a = s.action;
  if (a.kind != QuotaAction::Kind::kShare) return;
  if (!(a.rate > 0) || !std::isfinite(a.rate)) Broken("a share's rate", a.rate);
  if (a.strategy == QuotaStrategy::kTokenBucket) {
    if (a.max_tokens == 0 || a.tokens_per_fill == 0 || a.fill_interval <= Duration::Zero()) {
      Broken("a token bucket Envoy cannot apply", a.rate);
    }
    // Never faster than the share.
    const double fills = a.tokens_per_fill * 1e6 / static_cast<double>(a.fill_interval.micros());
    if (fills > a.rate * (1 + 1e-9)) Broken("a token bucket faster than its share", fills);
  } else if (a.requests_per_unit == 0 || a.unit <= Duration::Zero()) {
    Broken("requests per time unit of 0 sent as a share", a.rate);
  }
}

// The assignments sent, per Envoy (stream) and bucket, as the Envoys hold
// them.
class Envoys {
 public:
  explicit Envoys(const QuotaOptions& o) : margin_(o.delivery_margin) {}

  void Take(const QuotaBook::Send& s, Time now) {
    std::vector<std::pair<Time, QuotaAction>>& list = sent_[Bucket(s.domain, s.bucket)][s.stream];
    // What can no longer be in force is dropped: expired, or replaced by one
    // that surely arrived.
    std::erase_if(list, [&](const auto& e) { return now >= e.first + e.second.ttl + margin_; });
    if (!list.empty() && list.back().first + margin_ <= now) {
      list.erase(list.begin(), list.end() - 1);
    }
    list.emplace_back(now, s.action);
  }

  // The most that may be in force at `now` in bucket `key`.
  double InForce(const std::string& key, Time now) const {
    auto it = sent_.find(key);
    if (it == sent_.end()) return 0;
    double sum = 0;
    for (const auto& [stream, list] : it->second) {
      double most = 0;
      for (size_t i = 0; i < list.size(); ++i) {
        const auto& [at, action] = list[i];
        if (now >= at + action.ttl + margin_) continue;
        bool replaced = false;
        for (size_t j = i + 1; j < list.size(); ++j) replaced |= list[j].first + margin_ <= now;
        if (!replaced && action.kind == QuotaAction::Kind::kShare)
          most = std::max(most, action.rate);
      }
      sum += most;
    }
    return sum;
  }

  static std::string Bucket(const std::string& domain, const sluice::envoy::BucketKey& key) {
    std::string out = domain;
    for (const auto& [k, v] : key) out += "\n" + k + "=" + v;
    return out;
  }

 private:
  Duration margin_;
  std::map<std::string, std::map<uint64_t, std::vector<std::pair<Time, QuotaAction>>>> sent_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const QuotaOptions options = Options();
  QuotaBook book(options);
  Envoys envoys(options);
  std::map<uint64_t, std::string> domains;  // per open stream
  Time now = Time::FromUnixMicros(int64_t{1'700'006'400} * 1'000'000);
  size_t at = 0;
  while (at + 4 <= size) {
    const uint8_t op = data[at];
    const uint8_t advance = data[at + 1];
    const size_t length = data[at + 2] | (static_cast<size_t>(data[at + 3]) << 8);
    at += 4;
    if (length > size - at) break;
    const uint64_t stream = op & 7;
    now = now + Duration::Millis(advance * 20);
    if (op & 0x80) {
      book.Close(stream, now);
      domains.erase(stream);
    } else {
      rlqs::RateLimitQuotaUsageReports reports;
      if (reports.ParseFromArray(data + at, static_cast<int>(length))) {
        if (!sluice::envoy::ApplyReports(book, stream, domains[stream], reports, now).ok()) {
          // The service ends the stream.
          book.Close(stream, now);
          domains.erase(stream);
        }
      }
    }
    at += length;
    for (const QuotaBook::Send& s : book.Rebalance(now)) {
      CheckSend(s);
      envoys.Take(s, now);
    }
    for (const QuotaBook::BucketView& v : book.Buckets(now)) {
      const double limit = v.limit * (1 + 1e-9) + 1e-9;
      if (v.assigned > limit) Broken("more assigned than the limit", v.assigned);
      const double in_force = envoys.InForce(Envoys::Bucket(v.domain, v.bucket), now);
      if (in_force > limit) Broken("more may be in force than the limit", in_force);
    }
  }
  return 0;
}
