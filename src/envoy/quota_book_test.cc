#include "envoy/quota_book.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace sluice::envoy {
namespace {

using ::testing::HasSubstr;

constexpr Time kStart = Time::FromUnixMicros(1'800'000'000'000'000);
const BucketKey kApi = {{"name", "api"}};

QuotaOptions Options() {
  QuotaOptions o;
  o.ttl = Duration::Seconds(2);
  o.delivery_margin = Duration::Millis(500);
  o.abandon_after = Duration::Seconds(30);
  QuotaDomain web{.domain = "web"};
  web.rules.push_back({.match = {{"name", "api"}}, .limit = {.rate = {500, Duration::Seconds(1)}}});
  web.rules.push_back({.match = {{"client", "*"}, {"name", "per-client"}},
                       .limit = {.rate = {20, Duration::Seconds(1)}}});
  web.unknown = UnknownBucket::kDenyAll;
  o.domains.push_back(web);
  return o;
}

// Every assignment sent, as an Envoy would hold it: the latest one it got is
// in force until its TTL; one replaced by a newer one may still be in force
// until the newer arrives, at most the delivery margin after it was sent.
// The rates that may be in force at `t`, summed over the streams, is what
// must stay within the limit. Computed from what was sent alone.
class Envoys {
 public:
  explicit Envoys(const QuotaOptions& o) : ttl_(o.ttl), margin_(o.delivery_margin) {}

  void Take(const std::vector<QuotaBook::Send>& sends, Time now) {
    for (const QuotaBook::Send& s : sends) {
      sent_[s.stream].push_back({now, s.action});
      latest_[s.stream] = s.action;
    }
  }

  double InForce(Time t) const {
    double sum = 0;
    for (const auto& [stream, list] : sent_) {
      double most = 0;
      for (size_t i = 0; i < list.size(); ++i) {
        const auto& [at, action] = list[i];
        if (at > t || t >= at + action.ttl + margin_) continue;
        // Replaced by one sent more than the margin before t: surely gone.
        bool replaced = false;
        for (size_t j = i + 1; j < list.size(); ++j) {
          if (list[j].first + margin_ <= t) replaced = true;
        }
        if (replaced) continue;
        if (action.kind == QuotaAction::Kind::kShare) most = std::max(most, action.rate);
      }
      sum += most;
    }
    return sum;
  }

  const QuotaAction& Latest(QuotaBook::StreamId id) { return latest_[id]; }

 private:
  Duration ttl_;
  Duration margin_;
  std::map<QuotaBook::StreamId, std::vector<std::pair<Time, QuotaAction>>> sent_;
  std::map<QuotaBook::StreamId, QuotaAction> latest_;
};

// Three Envoys wanting 10, 100 and 1000 a second of a bucket limited to
// 500: max-min fair shares are 10, 100 and 390. They report every second.
TEST(QuotaBook, SharesConvergeMaxMinFairAndNeverSumPastTheLimit) {
  const QuotaOptions options = Options();
  QuotaBook book(options);
  Envoys envoys(options);
  const std::map<QuotaBook::StreamId, double> demand = {{1, 10}, {2, 100}, {3, 1000}};
  Time now = kStart;
  // The watch: no usage yet, each gets a third.
  for (const auto& [id, d] : demand) {
    ASSERT_TRUE(book.Report(id, "web", kApi, Duration::Zero(), 0, 0, now).ok());
  }
  envoys.Take(book.Rebalance(now), now);
  for (const auto& [id, d] : demand) EXPECT_NEAR(envoys.Latest(id).rate, 500.0 / 3, 1e-6);
  double worst = 0;
  for (int step = 1; step <= 80; ++step) {  // 8 s in steps of 100 ms
    now = now + Duration::Millis(100);
    if (step % 10 == 0) {
      for (const auto& [id, d] : demand) {
        ASSERT_TRUE(book.Report(id, "web", kApi, Duration::Seconds(1), static_cast<uint64_t>(d / 2),
                                static_cast<uint64_t>(d / 2), now)
                        .ok());
      }
    }
    envoys.Take(book.Rebalance(now), now);
    for (const QuotaBook::BucketView& v : book.Buckets(now)) {
      EXPECT_LE(v.committed, v.limit + 1e-6);
    }
    // Checked a moment after and just before the next step too.
    for (const Duration d : {Duration::Zero(), Duration::Millis(50), Duration::Millis(99)}) {
      worst = std::max(worst, envoys.InForce(now + d));
    }
  }
  EXPECT_LE(worst, 500 + 1e-6);
  EXPECT_NEAR(envoys.Latest(1).rate, 10, 1e-6);
  EXPECT_NEAR(envoys.Latest(2).rate, 100, 1e-6);
  EXPECT_NEAR(envoys.Latest(3).rate, 390, 1e-6);
  // A token bucket of that rate: fills never faster than the share.
  const QuotaAction& big = envoys.Latest(3);
  EXPECT_EQ(big.kind, QuotaAction::Kind::kShare);
  EXPECT_LE(big.tokens_per_fill * 1e6 / big.fill_interval.micros(), 390 + 1e-9);
  EXPECT_GE(big.tokens_per_fill * 1e6 / big.fill_interval.micros(), 389);
  EXPECT_EQ(big.max_tokens, 390u);  // the burst (500) split as the rate
}

// One leaves, one joins: the leaver's share goes to the others only after
// its assignment passed; the newcomer's comes out of the others' next
// assignments; the sum never passes the limit.
TEST(QuotaBook, LeavingAndJoiningNeverAddOnTop) {
  const QuotaOptions options = Options();
  QuotaBook book(options);
  Envoys envoys(options);
  std::map<QuotaBook::StreamId, double> demand = {{1, 10}, {2, 100}, {3, 1000}};
  Time now = kStart;
  double worst = 0;
  auto run = [&](int seconds) {
    for (int step = 1; step <= seconds * 10; ++step) {
      now = now + Duration::Millis(100);
      if (step % 10 == 0) {
        for (const auto& [id, d] : demand) {
          ASSERT_TRUE(
              book.Report(id, "web", kApi, Duration::Seconds(1), static_cast<uint64_t>(d), 0, now)
                  .ok());
        }
      }
      envoys.Take(book.Rebalance(now), now);
      for (const Duration d : {Duration::Zero(), Duration::Millis(50), Duration::Millis(99)}) {
        worst = std::max(worst, envoys.InForce(now + d));
      }
    }
  };
  for (const auto& [id, d] : demand) {
    ASSERT_TRUE(book.Report(id, "web", kApi, Duration::Zero(), 0, 0, now).ok());
  }
  envoys.Take(book.Rebalance(now), now);
  run(6);
  EXPECT_NEAR(envoys.Latest(3).rate, 390, 1e-6);
  // Stream 2 leaves: 3 gets its 100 once the last assignment to 2 passed
  // (2 s of TTL and 0.5 s of margin), not before.
  book.Close(2, now);
  demand.erase(2);
  run(2);
  EXPECT_NEAR(envoys.Latest(3).rate, 390, 1e-6);
  run(2);
  EXPECT_NEAR(envoys.Latest(3).rate, 490, 1e-6);
  // Stream 4 joins, wanting 200 (less than half of the 490 the two hungry
  // ones share): 3 shrinks at once, 4 grows as 3's larger assignment
  // passes; meanwhile 4 is denied (a share of 0).
  demand[4] = 200;
  ASSERT_TRUE(book.Report(4, "web", kApi, Duration::Zero(), 0, 0, now).ok());
  envoys.Take(book.Rebalance(now), now);
  EXPECT_EQ(envoys.Latest(4).kind, QuotaAction::Kind::kDenyAll);
  run(5);
  EXPECT_NEAR(envoys.Latest(1).rate, 10, 1e-6);
  EXPECT_NEAR(envoys.Latest(3).rate, 290, 1e-6);
  EXPECT_NEAR(envoys.Latest(4).rate, 200, 1e-6);
  EXPECT_LE(worst, 500 + 1e-6);
}

// A reload: the bucket's limit drops from 500 to 200; the shares shrink
// at once. Then the domain goes: its buckets are abandoned.
TEST(QuotaBook, AReloadTakesTheNewRulesAndKeepsTheBuckets) {
  QuotaOptions options = Options();
  QuotaBook book(options);
  Time now = kStart;
  for (QuotaBook::StreamId id : {1, 2}) {
    ASSERT_TRUE(book.Report(id, "web", kApi, Duration::Seconds(1), 1000, 0, now).ok());
  }
  std::map<QuotaBook::StreamId, QuotaAction> got;
  for (const QuotaBook::Send& s : book.Rebalance(now)) got[s.stream] = s.action;
  EXPECT_NEAR(got[1].rate, 250, 1e-6);
  options.domains[0].rules[0].limit.rate = {200, Duration::Seconds(1)};
  book.Reconfigure(options);
  now = now + Duration::Millis(100);
  got.clear();
  for (const QuotaBook::Send& s : book.Rebalance(now)) got[s.stream] = s.action;
  EXPECT_NEAR(got[1].rate, 100, 1e-6);
  EXPECT_NEAR(got[2].rate, 100, 1e-6);
  options.domains.clear();
  book.Reconfigure(options);
  now = now + Duration::Millis(100);
  got.clear();
  for (const QuotaBook::Send& s : book.Rebalance(now)) got[s.stream] = s.action;
  EXPECT_EQ(got[1].kind, QuotaAction::Kind::kAbandon);
  EXPECT_EQ(got[2].kind, QuotaAction::Kind::kAbandon);
  // A report for it now is refused: the domain is gone.
  EXPECT_FALSE(book.Report(1, "web", kApi, Duration::Seconds(1), 1, 0, now).ok());
}

TEST(QuotaBook, RulesWildcardsAndUnknownBuckets) {
  QuotaOptions options = Options();
  QuotaBook book(options);
  const Time now = kStart;
  // {name: per-client, client: *}: each client a bucket of its own.
  ASSERT_TRUE(
      book.Report(1, "web", {{"name", "per-client"}, {"client", "a"}}, Duration::Zero(), 0, 0, now)
          .ok());
  ASSERT_TRUE(
      book.Report(1, "web", {{"client", "b"}, {"name", "per-client"}}, Duration::Zero(), 0, 0, now)
          .ok());
  // No rule matches: deny all (the domain's unknown).
  ASSERT_TRUE(book.Report(1, "web", {{"name", "other"}}, Duration::Zero(), 0, 0, now).ok());
  std::map<std::string, QuotaAction> got;
  for (const QuotaBook::Send& s : book.Rebalance(now)) {
    std::string name;
    for (const auto& [k, v] : s.bucket) name += k + "=" + v + ",";
    got[name] = s.action;
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_NEAR(got["client=a,name=per-client,"].rate, 20, 1e-9);
  EXPECT_NEAR(got["client=b,name=per-client,"].rate, 20, 1e-9);
  EXPECT_EQ(got["name=other,"].kind, QuotaAction::Kind::kDenyAll);
  // Requests per time unit: the shortest unit holding ten or more.
  const QuotaAction per_unit = QuotaBook::ShareAction(
      {.rate = {500, Duration::Seconds(1)}, .strategy = QuotaStrategy::kRequestsPerTimeUnit}, 2.5,
      Duration::Seconds(2));
  EXPECT_EQ(per_unit.unit, Duration::Minutes(1));
  EXPECT_EQ(per_unit.requests_per_unit, 150u);
}

TEST(QuotaBook, BadReportsAreRefusedAndBucketsPerStreamBounded) {
  QuotaOptions options = Options();
  options.max_buckets_per_stream = 3;
  QuotaBook book(options);
  const Time now = kStart;
  EXPECT_THAT(book.Report(1, "mail", kApi, Duration::Zero(), 0, 0, now).message(),
              HasSubstr("unknown domain \"mail\""));
  EXPECT_THAT(book.Report(1, "web", {}, Duration::Zero(), 0, 0, now).message(),
              HasSubstr("no entries"));
  EXPECT_THAT(book.Report(1, "web", {{"name", ""}}, Duration::Zero(), 0, 0, now).message(),
              HasSubstr("empty key or value"));
  EXPECT_THAT(book.Report(1, "web", kApi, Duration::Hours(2), 0, 0, now).message(),
              HasSubstr("time_elapsed must be between 0 and 1h"));
  EXPECT_THAT(book.Report(1, "web", kApi, Duration::Seconds(-1), 0, 0, now).message(),
              HasSubstr("time_elapsed"));
  EXPECT_THAT(
      book.Report(1, "web", kApi, Duration::Seconds(1), uint64_t{1} << 60, 0, now).message(),
      HasSubstr("above 2^48"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        book.Report(1, "web", {{"name", "x" + std::to_string(i)}}, Duration::Zero(), 0, 0, now)
            .ok());
  }
  const absl::Status flood = book.Report(1, "web", {{"name", "x3"}}, Duration::Zero(), 0, 0, now);
  EXPECT_EQ(flood.code(), absl::StatusCode::kResourceExhausted);
  // Another stream has its own allowance.
  EXPECT_TRUE(book.Report(2, "web", {{"name", "x3"}}, Duration::Zero(), 0, 0, now).ok());
}

TEST(QuotaBook, ABucketNotReportedIsAbandoned) {
  QuotaBook book(Options());
  Time now = kStart;
  ASSERT_TRUE(book.Report(1, "web", kApi, Duration::Zero(), 0, 0, now).ok());
  EXPECT_EQ(book.Rebalance(now).size(), 1u);
  now = now + Duration::Seconds(31);
  std::vector<QuotaBook::Send> sends = book.Rebalance(now);
  ASSERT_FALSE(sends.empty());
  EXPECT_EQ(sends.front().action.kind, QuotaAction::Kind::kAbandon);
  // Its share is freed after its assignment passed; then the bucket is gone.
  now = now + Duration::Seconds(3);
  (void)book.Rebalance(now);
  EXPECT_TRUE(book.Buckets(now).empty());
}

}  // namespace
}  // namespace sluice::envoy
