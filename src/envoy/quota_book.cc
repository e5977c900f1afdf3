#include "envoy/quota_book.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/cat.h"

namespace sluice::envoy {

using internal::Cat;

namespace {

constexpr uint64_t kMaxReportedCount = uint64_t{1} << 48;
// A bucket_id's size: its entries and each key's and value's bytes.
constexpr size_t kMaxBucketEntries = 16;
constexpr size_t kMaxBucketText = 512;
// Rates closer than this (requests per second) are the same share.
constexpr double kSameRate = 1e-9;

// Requests per second of `rate`.
double PerSecond(const Rate& rate) {
  return static_cast<double>(rate.limit) * 1e6 / static_cast<double>(rate.period.micros());
}

bool Matches(const BucketKey& match, const BucketKey& bucket) {
  for (const auto& [key, value] : match) {
    auto it = std::lower_bound(bucket.begin(), bucket.end(), std::make_pair(key, std::string()),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it == bucket.end() || it->first != key) return false;
    if (value != "*" && it->second != value) return false;
  }
  return true;
}

// Max-min fair shares of `limit` among `demands` (a negative demand: not
// known, as much as it can get): whoever wants less than an equal share of
// what is left gets what it wants, the rest share the rest equally.
std::vector<double> WaterFill(double limit, const std::vector<double>& demands) {
  std::vector<size_t> order(demands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto want = [&](size_t i) {
    return demands[i] < 0 ? std::numeric_limits<double>::infinity() : demands[i];
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return want(a) < want(b); });
  std::vector<double> shares(demands.size(), 0);
  double left = limit;
  for (size_t k = 0; k < order.size(); ++k) {
    const double fair = left / static_cast<double>(order.size() - k);
    const double give = std::min(want(order[k]), fair);
    shares[order[k]] = give;
    left -= give;
  }
  return shares;
}

}  // namespace

QuotaBook::QuotaBook(QuotaOptions options) : options_(std::move(options)) {}

QuotaAction QuotaBook::ShareAction(const QuotaLimit& limit, double rate, Duration ttl) {
  QuotaAction a;
  a.ttl = ttl;
  a.strategy = limit.strategy;
  a.rate = rate;
  const double whole = PerSecond(limit.rate);
  if (rate <= kSameRate) {
    a.kind = QuotaAction::Kind::kDenyAll;
    return a;
  }
  a.kind = QuotaAction::Kind::kShare;
  if (limit.strategy == QuotaStrategy::kTokenBucket) {
    // Up to a hundred fills a second; the interval rounded up, so the
    // bucket never fills faster than the share.
    const double per_fill = std::floor(rate / 100);
    a.tokens_per_fill =
        static_cast<uint32_t>(std::clamp(per_fill, 1.0, static_cast<double>(UINT32_MAX)));
    const double interval_ns = std::ceil(a.tokens_per_fill * 1e9 / rate);
    a.fill_interval = Duration::Micros(static_cast<int64_t>(std::ceil(interval_ns / 1000)));
    // The burst, split as the rate is (at least one token: Envoy needs one).
    const double burst = static_cast<double>(limit.burst > 0 ? limit.burst : limit.rate.limit);
    a.max_tokens = static_cast<uint32_t>(
        std::clamp(std::floor(burst * rate / whole), 1.0, static_cast<double>(UINT32_MAX)));
    return a;
  }
  // Requests per time unit: the shortest unit that holds ten or more (the
  // floor loses at most a tenth), else a day.
  for (const Duration unit :
       {Duration::Seconds(1), Duration::Minutes(1), Duration::Hours(1), Duration::Days(1)}) {
    a.unit = unit;
    a.requests_per_unit = static_cast<uint64_t>(std::floor(rate * unit.micros() / 1e6));
    if (a.requests_per_unit >= 10) break;
  }
  if (a.requests_per_unit == 0) a.kind = QuotaAction::Kind::kDenyAll;
  return a;
}

std::optional<QuotaAction> QuotaBook::RuleAction(const std::string& domain,
                                                 const BucketKey& bucket) const {
  for (const QuotaDomain& d : options_.domains) {
    if (d.domain != domain) continue;
    for (const QuotaRule& rule : d.rules) {
      if (Matches(rule.match, bucket)) {
        return ShareAction(rule.limit, PerSecond(rule.limit.rate), options_.ttl);
      }
    }
    QuotaAction a;
    a.ttl = options_.ttl;
    switch (d.unknown) {
      case UnknownBucket::kAllowAll:
        a.kind = QuotaAction::Kind::kAllowAll;
        return a;
      case UnknownBucket::kDenyAll:
        a.kind = QuotaAction::Kind::kDenyAll;
        return a;
      case UnknownBucket::kLimit:
        return ShareAction(d.unknown_limit, PerSecond(d.unknown_limit.rate), options_.ttl);
    }
  }
  return std::nullopt;
}

absl::Status QuotaBook::Report(StreamId stream, const std::string& domain, BucketKey bucket,
                               Duration elapsed, uint64_t allowed, uint64_t denied, Time now) {
  if (bucket.empty()) return absl::InvalidArgumentError("a bucket_id with no entries");
  if (bucket.size() > kMaxBucketEntries) {
    return absl::InvalidArgumentError(
        Cat("a bucket_id with more than ", kMaxBucketEntries, " entries"));
  }
  std::sort(bucket.begin(), bucket.end());
  for (size_t i = 0; i < bucket.size(); ++i) {
    if (bucket[i].first.empty() || bucket[i].second.empty()) {
      return absl::InvalidArgumentError("a bucket_id entry with an empty key or value");
    }
    if (bucket[i].first.size() > kMaxBucketText || bucket[i].second.size() > kMaxBucketText) {
      return absl::InvalidArgumentError(
          Cat("a bucket_id key or value longer than ", kMaxBucketText, " bytes"));
    }
    if (i > 0 && bucket[i].first == bucket[i - 1].first) {
      return absl::InvalidArgumentError(Cat("bucket_id key \"", bucket[i].first, "\" twice"));
    }
  }
  if (elapsed < Duration::Zero() || elapsed > Duration::Hours(1)) {
    return absl::InvalidArgumentError(
        Cat("time_elapsed must be between 0 and 1h, got ", FormatDuration(elapsed)));
  }
  if (allowed > kMaxReportedCount || denied > kMaxReportedCount) {
    return absl::InvalidArgumentError("num_requests_allowed or _denied above 2^48");
  }
  if (!HasDomain(domain)) return absl::InvalidArgumentError(Cat("unknown domain \"", domain, "\""));
  auto key = std::make_pair(domain, std::move(bucket));
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    Bucket b;
    Resolve(key.first, key.second, b);
    it = buckets_.emplace(std::move(key), std::move(b)).first;
  }
  Bucket& b = it->second;
  auto m = b.members.find(stream);
  if (m == b.members.end() || m->second.closed) {
    // A bucket new to the stream (or abandoned and reported again).
    int64_t& held = stream_buckets_[stream];
    if (held >= options_.max_buckets_per_stream) {
      if (b.members.empty()) buckets_.erase(it);
      return absl::ResourceExhaustedError(
          Cat("a stream may report at most ", options_.max_buckets_per_stream, " buckets"));
    }
    ++held;
    if (m == b.members.end()) m = b.members.emplace(stream, Member{}).first;
    m->second.closed = false;
  }
  Member& member = m->second;
  member.last_report = now;
  if (elapsed > Duration::Zero()) {
    member.demand =
        static_cast<double>(allowed + denied) * 1e6 / static_cast<double>(elapsed.micros());
  }
  b.allowed += allowed;
  b.denied += denied;
  b.dirty = true;
  // Every report is answered: the stream's assignment renewed.
  member.resend = true;
  return absl::OkStatus();
}

void QuotaBook::Resolve(const std::string& domain, const BucketKey& bucket, Bucket& b) const {
  b.limit.reset();
  b.rule.clear();
  for (const QuotaDomain& d : options_.domains) {
    if (d.domain != domain) continue;
    for (const QuotaRule& r : d.rules) {
      if (Matches(r.match, bucket)) {
        b.limit = r.limit;
        for (const auto& [k, v] : r.match) {
          if (!b.rule.empty()) b.rule.push_back(',');
          b.rule += k + "=" + v;
        }
        break;
      }
    }
    if (b.rule.empty()) {
      b.rule = "unknown";
      if (d.unknown == UnknownBucket::kLimit) b.limit = d.unknown_limit;
      b.blanket = d.unknown == UnknownBucket::kAllowAll ? QuotaAction::Kind::kAllowAll
                                                        : QuotaAction::Kind::kDenyAll;
    }
  }
  if (b.limit.has_value()) {
    b.rule_rate = PerSecond(b.limit->rate);
    if (!options_.fleet) b.rate = b.rule_rate;
  }
}

void QuotaBook::Reconfigure(QuotaOptions options) {
  options.fleet = options_.fleet;
  options_ = std::move(options);
  for (auto& [key, b] : buckets_) {
    if (!HasDomain(key.first)) {
      // A domain no longer served: its buckets are abandoned at the next
      // Rebalance, and their shares freed as a closed stream's are.
      for (auto& [id, m] : b.members) m.last_report = Time::FromUnixMicros(0);
      continue;
    }
    Resolve(key.first, key.second, b);
    b.dirty = true;
    for (auto& [id, m] : b.members) m.resend = true;  // the new rule, sent now
  }
}

void QuotaBook::Close(StreamId stream, Time now) {
  (void)now;
  for (auto& [key, b] : buckets_) {
    auto m = b.members.find(stream);
    if (m == b.members.end()) continue;
    m->second.closed = true;
    b.dirty = true;
  }
  stream_buckets_.erase(stream);
}

double QuotaBook::Committed(const Member& m, Time now) const {
  double c = 0;
  // A closed stream's last assignment is in force until its TTL passed.
  if (!m.closed) {
    c = m.assigned;
  } else if (m.sent && now < m.sent_at + options_.ttl + options_.delivery_margin) {
    c = m.assigned;
  }
  for (const Member::Older& o : m.older) {
    if (now < o.until) c = std::max(c, o.rate);
  }
  return c;
}

double QuotaBook::RateNow(const Bucket& b, Time now) const {
  if (!options_.fleet) return b.rule_rate;
  // A claim is used only while it outlasts what is sent now; while a new
  // one is asked, nothing grows past what the Envoys may hold (the floor
  // sent), so the answer, never below it, is never below what they hold.
  if (now + options_.ttl + options_.delivery_margin >= b.claim_until) return 0;
  double rate = std::min({b.rule_rate, b.claim, b.claim_target});
  if (b.claim_in_flight) rate = std::min(rate, b.claim_floor);
  return rate;
}

std::vector<QuotaBook::ClaimNeed> QuotaBook::ClaimNeeds(Time now) {
  std::vector<ClaimNeed> out;
  if (!options_.fleet) return out;
  for (auto& [key, b] : buckets_) {
    if (!b.limit.has_value() || b.claim_in_flight) continue;
    ClaimNeed need{.domain = key.first, .bucket = key.second, .limit = b.rule_rate};
    for (const auto& [id, m] : b.members) {
      if (!m.closed) need.want += m.demand < 0 ? b.rule_rate : m.demand;
      need.floor += Committed(m, now);
    }
    need.want = std::min(need.want, b.rule_rate);
    const bool good = now + options_.ttl + options_.delivery_margin < b.claim_until;
    const bool hungry = need.want > b.claim + kSameRate || need.floor < b.claim - kSameRate;
    const Duration every = good && !hungry ? Duration::Seconds(1) : Duration::Millis(100);
    if (now - b.claim_asked < every) continue;
    b.claim_asked = now;
    b.claim_in_flight = true;
    b.claim_floor = need.floor;
    out.push_back(std::move(need));
  }
  return out;
}

void QuotaBook::SetClaim(const std::string& domain, const BucketKey& bucket, double rate,
                         double target, Time valid_until) {
  auto it = buckets_.find(std::make_pair(domain, bucket));
  if (it == buckets_.end()) return;
  it->second.claim = rate;
  it->second.claim_target = target;
  it->second.claim_until = valid_until;
  it->second.claim_in_flight = false;
  it->second.dirty = true;
}

void QuotaBook::ClaimFailed(const std::string& domain, const BucketKey& bucket) {
  auto it = buckets_.find(std::make_pair(domain, bucket));
  if (it == buckets_.end()) return;
  it->second.claim_in_flight = false;
  it->second.dirty = true;
}

void QuotaBook::RebalanceBucket(const std::string& domain, const BucketKey& key, Bucket& b,
                                Time now, bool renew_all, std::vector<Send>& out) {
  b.rate = RateNow(b, now);
  // What passed no longer counts; a closed stream whose assignments all
  // passed is gone.
  for (auto it = b.members.begin(); it != b.members.end();) {
    Member& m = it->second;
    std::erase_if(m.older, [&](const Member::Older& o) { return now >= o.until; });
    if (m.closed && Committed(m, now) <= kSameRate) {
      it = b.members.erase(it);
    } else {
      ++it;
    }
  }
  auto send = [&](StreamId id, Member& m, QuotaAction action) {
    m.sent = true;
    m.resend = false;
    m.sent_at = now;
    out.push_back({.stream = id, .domain = domain, .bucket = key, .action = std::move(action)});
  };
  if (!b.limit.has_value()) {
    for (auto& [id, m] : b.members) {
      if (m.closed || !(m.resend || !m.sent || renew_all)) continue;
      QuotaAction a;
      a.kind = b.blanket;
      a.ttl = options_.ttl;
      send(id, m, a);
    }
    return;
  }
  std::vector<StreamId> ids;
  std::vector<double> demands;
  for (auto& [id, m] : b.members) {
    if (m.closed) continue;
    ids.push_back(id);
    demands.push_back(m.demand);
  }
  const std::vector<double> target = WaterFill(b.rate, demands);
  std::vector<bool> changed(ids.size(), false);
  // Shrinking takes effect at once; what it frees counts only once the
  // larger assignment can no longer be in force.
  for (size_t i = 0; i < ids.size(); ++i) {
    Member& m = b.members[ids[i]];
    if (target[i] < m.assigned - kSameRate) {
      if (m.sent) {
        m.older.push_back(
            {.rate = m.assigned, .until = m.sent_at + options_.ttl + options_.delivery_margin});
      }
      m.assigned = target[i];
      changed[i] = true;
    }
  }
  double free = b.rate;
  for (const auto& [id, m] : b.members) free -= Committed(m, now);
  // Growing comes from what is free, shared among those who grow, the
  // least hungry first.
  std::vector<size_t> grow;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (target[i] > b.members[ids[i]].assigned + kSameRate) grow.push_back(i);
  }
  std::sort(grow.begin(), grow.end(), [&](size_t x, size_t y) {
    return target[x] - b.members[ids[x]].assigned < target[y] - b.members[ids[y]].assigned;
  });
  for (size_t k = 0; k < grow.size(); ++k) {
    const size_t i = grow[k];
    Member& m = b.members[ids[i]];
    const double committed = Committed(m, now);
    // Up to what it may enforce already costs nothing more.
    const double room = std::max(0.0, committed - m.assigned) +
                        std::max(0.0, free) / static_cast<double>(grow.size() - k);
    const double give = std::min(target[i] - m.assigned, room);
    if (give <= kSameRate) continue;
    free -= std::max(0.0, m.assigned + give - committed);
    m.assigned += give;
    changed[i] = true;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Member& m = b.members[ids[i]];
    if (changed[i] || m.resend || !m.sent || renew_all) {
      send(ids[i], m, ShareAction(*b.limit, m.assigned, options_.ttl));
    }
  }
}

std::vector<QuotaBook::Send> QuotaBook::Rebalance(Time now) {
  std::vector<Send> out;
  const bool renew_all = now - last_renewal_ >= Duration::Micros(options_.ttl.micros() / 2);
  // Fleet mode: a bucket's limit moves with its claim's time, so every
  // bucket is looked at every 100 ms (not on every report).
  const bool fleet_pass = options_.fleet && now - last_fleet_pass_ >= Duration::Millis(100);
  if (fleet_pass) last_fleet_pass_ = now;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    Bucket& b = it->second;
    // Buckets a stream stopped reporting are abandoned for it.
    for (auto m = b.members.begin(); m != b.members.end();) {
      if (!m->second.closed && now - m->second.last_report >= options_.abandon_after) {
        QuotaAction a;
        a.kind = QuotaAction::Kind::kAbandon;
        out.push_back({.stream = m->first,
                       .domain = it->first.first,
                       .bucket = it->first.second,
                       .action = a});
        auto held = stream_buckets_.find(m->first);
        if (held != stream_buckets_.end() && --held->second == 0) stream_buckets_.erase(held);
        // Its share is freed as a closed stream's is.
        m->second.closed = true;
        b.dirty = true;
      }
      ++m;
    }
    // Shares freed by assignments that passed let others grow.
    const bool freeing = std::any_of(b.members.begin(), b.members.end(), [](const auto& m) {
      return m.second.closed || !m.second.older.empty();
    });
    if (b.dirty || renew_all || freeing || fleet_pass) {
      RebalanceBucket(it->first.first, it->first.second, b, now, renew_all, out);
      b.dirty = false;
    }
    // A bucket with no stream left is forgotten (a claim asked for it is
    // answered into nothing; its claim in the store passes by itself).
    if (b.members.empty() && !b.claim_in_flight) {
      it = buckets_.erase(it);
    } else {
      ++it;
    }
  }
  if (renew_all) last_renewal_ = now;
  return out;
}

bool QuotaBook::HasDomain(const std::string& domain) const {
  return std::any_of(options_.domains.begin(), options_.domains.end(),
                     [&](const QuotaDomain& d) { return d.domain == domain; });
}

std::vector<QuotaBook::BucketView> QuotaBook::Buckets(Time now) const {
  std::vector<BucketView> views;
  for (const auto& [key, b] : buckets_) {
    BucketView v{.domain = key.first,
                 .bucket = key.second,
                 .rule = b.rule,
                 .limit = b.rate,
                 .allowed = b.allowed,
                 .denied = b.denied};
    for (const auto& [id, m] : b.members) {
      if (!m.closed) {
        ++v.streams;
        v.assigned += m.assigned;
      }
      v.committed += Committed(m, now);
    }
    views.push_back(std::move(v));
  }
  return views;
}

}  // namespace sluice::envoy
