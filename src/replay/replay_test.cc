#include "replay/replay.h"

#include <cstdio>
#include <fstream>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sluice::replay {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kStart = 1'704'067'200;  // 2024-01-01T00:00:00Z

std::string CombinedTime(int64_t epoch) {
  // The log's zone is +0100: one hour ahead of UTC.
  const std::string utc = FormatUtc(Time::FromUnixMicros((epoch + 3600) * 1'000'000));
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  // 2024-01-01T01:00:00Z -> 01/Jan/2024:01:00:00 +0100
  return utc.substr(8, 2) + "/" + kMonths[std::stoi(utc.substr(5, 2)) - 1] + "/" +
         utc.substr(0, 4) + ":" + utc.substr(11, 8) + " +0100";
}

std::string Line(const std::string& ip, int64_t epoch, const std::string& method,
                 const std::string& path) {
  return ip + " - - [" + CombinedTime(epoch) + "] \"" + method + " " + path +
         " HTTP/1.1\" 200 12 \"-\" \"test\"\n";
}

Config ConfigOf(std::string_view yaml) {
  absl::StatusOr<Config> c = ParseConfig(yaml, "replay.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

ReplayReport ReplayText(const Config& config, const std::string& log, ReplayOptions options = {}) {
  const std::string path = testing::TempDir() + "/replay_test.log";
  std::ofstream(path, std::ios::binary) << log;
  absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open(path);
  EXPECT_TRUE(in.ok());
  absl::StatusOr<ReplayReport> report = Replay(config, **in, options);
  std::remove(path.c_str());
  EXPECT_TRUE(report.ok()) << report.status();
  return *std::move(report);
}

const PolicyReport& PolicyNamed(const ReplayReport& r, std::string_view name) {
  for (const PolicyReport& p : r.policies) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no policy " << name;
  return r.policies.front();
}

// A log with known per-key rates: 1999 addresses log in once every 10 s
// (6 a minute), one address twice a second (120 a minute), for 10 minutes;
// also 3 broken lines and 2 lines out of order.
std::string KnownRatesLog() {
  std::map<int64_t, std::string> by_time;  // time * 10000 + n -> line, in order
  for (int64_t ip = 0; ip < 1999; ++ip) {
    const std::string addr = "10.0." + std::to_string(ip / 250) + "." + std::to_string(ip % 250);
    for (int64_t t = ip % 10; t < 600; t += 10)
      by_time[t * 10'000 + ip] = Line(addr, kStart + t, "POST", "/login");
  }
  for (int64_t t = 0; t < 600; ++t) {
    for (int64_t k = 0; k < 2; ++k)
      by_time[t * 10'000 + 5000 + k] = Line("203.0.113.66", kStart + t, "POST", "/login");
    by_time[t * 10'000 + 6000] =
        Line("10.9.9.9", kStart + t, "GET", "/static/app.js");  // matches no policy
  }
  std::string log;
  int64_t n = 0;
  for (const auto& [key, line] : by_time) {
    log += line;
    if (++n == 1000) {
      log += "this is not a log line\n";
      log += "10.1.1.1 - - [99/Xyz/2024:00:00:00 +0000] \"GET / HTTP/1.1\" 200 0\n";
      log += "10.1.1.1 - - [01/Jan/2024:01:00:30 +0100] \"-\" 400 0\n";
      log += "\n";
    }
    if (n == 2000)
      log += Line("10.1.1.2", kStart + key / 10'000 - 5, "GET", "/late") +
             Line("10.1.1.3", kStart + key / 10'000 - 2, "GET", "/late");
  }
  return log;
}

constexpr std::string_view kLoginConfig = R"(
policies:
  - name: login
    match: {path_prefix: /login, method: POST}
    key: [client_ip]
    limits:
      - {algorithm: sliding_log, rate: 60/min}
  - name: api
    key: ["header:X-Api-Key"]
    limits:
      - {algorithm: gcra, rate: 10/s}
)";

TEST(Replay, FindsTheKeysAboveTheLimitAndSuggestsAFittingOne) {
  const ReplayReport r = ReplayText(ConfigOf(kLoginConfig), KnownRatesLog());
  EXPECT_EQ(r.requests, 1999 * 60 + 600 * 3 + 2);
  EXPECT_EQ(r.broken, 3);
  EXPECT_EQ(r.broken_by_reason[static_cast<size_t>(LineError::kSyntax)], 1);
  EXPECT_EQ(r.broken_by_reason[static_cast<size_t>(LineError::kTime)], 1);
  EXPECT_EQ(r.broken_by_reason[static_cast<size_t>(LineError::kRequest)], 1);
  EXPECT_EQ(r.out_of_order, 2);
  EXPECT_EQ(r.max_lateness, Duration::Seconds(5));
  EXPECT_EQ(r.format, LogFormat::kCombined);
  ASSERT_TRUE(r.first_time.has_value());
  EXPECT_EQ(*r.first_time, Time::FromUnixMicros(kStart * 1'000'000));
  EXPECT_THAT(r.skipped, testing::ElementsAre("api"));  // no match: decision API only

  ASSERT_EQ(r.policies.size(), 1u);
  const PolicyReport& login = PolicyNamed(r, "login");
  EXPECT_EQ(login.requests, 1999 * 60 + 1200);
  EXPECT_EQ(login.keys, 2000);
  // Only the address at 120/min is limited: 60 of every 120 a minute.
  EXPECT_EQ(login.limited_keys, 1);
  ASSERT_EQ(login.top.size(), 1u);
  EXPECT_EQ(login.top[0].key, "203.0.113.66");
  EXPECT_EQ(login.top[0].requests, 1200);
  EXPECT_EQ(login.top[0].limited, 600);
  EXPECT_EQ(login.limited, 600);
  EXPECT_EQ(login.top[0].first_limited, Time::FromUnixMicros((kStart + 30) * 1'000'000));
  ASSERT_FALSE(login.busiest_minutes.empty());
  EXPECT_EQ(login.busiest_minutes[0].limited, 60);

  // Peaks per key: 6 a minute for 1999 keys, 120 for one. 99.9% of keys
  // fit in 6/min; the current 60/min is exceeded by one key.
  ASSERT_EQ(login.suggestions.size(), 1u);
  const PeriodSuggestion& s = login.suggestions[0];
  EXPECT_EQ(s.period, Duration::Minutes(1));
  EXPECT_EQ(s.keys, 2000);
  EXPECT_EQ(s.p50, 6);
  EXPECT_EQ(s.p999, 6);
  EXPECT_EQ(s.max, 120);
  EXPECT_EQ(s.current, 60);
  EXPECT_EQ(s.keys_over_current, 1);

  const std::string text = FormatReplayText(r);
  EXPECT_THAT(
      text,
      HasSubstr("3 broken (not the log format 1, bad time 1, bad request line 1; first at line"));
  EXPECT_THAT(text, HasSubstr("2 out of order"));
  EXPECT_THAT(text, HasSubstr("203.0.113.66"));
  EXPECT_THAT(text, HasSubstr("6/min"));
  EXPECT_THAT(text, HasSubstr("policy api: no match"));
  const nlohmann::json j = nlohmann::json::parse(FormatReplayJson(r));
  EXPECT_EQ(j["broken"]["total"], 3);
  EXPECT_EQ(j["policies"][0]["top"][0]["key"], "203.0.113.66");
  EXPECT_EQ(j["policies"][0]["suggestions"][0]["suggested"], "6/1m");
}

TEST(Replay, CountsAnIpv6ClientByItsNetworkAsTheServerDoes) {
  std::string log;
  for (const char* ip : {"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::3",
                         "2001:db8:1:3::1", "::ffff:198.51.100.7", "198.51.100.7"}) {
    log += Line(ip, kStart, "POST", "/login");
  }
  const ReplayReport r = ReplayText(ConfigOf(R"(
policies:
  - name: login
    match: {path_prefix: /login, method: POST}
    limits: [{algorithm: fixed_window, rate: 1/min}]
)"),
                                    log);
  const PolicyReport& login = PolicyNamed(r, "login");
  EXPECT_EQ(login.keys, 3);  // the two /64s, and one IPv4 client
  EXPECT_EQ(login.limited, 3);
  ASSERT_FALSE(login.top.empty());
  EXPECT_EQ(login.top[0].key, "2001:db8:1:2::/64");
  EXPECT_EQ(login.top[0].limited, 2);
}

TEST(Replay, AppliesADecisionApiPolicyToEveryLineWhenAsked) {
  std::string log;
  for (int64_t t = 0; t < 10; ++t) {
    for (int k = 0; k < 20; ++k) {
      log += R"({"time": )" + std::to_string(kStart + t) +
             R"(, "remote_addr": "10.0.0.1", "path": "/v1/x", )" + R"("http_x_api_key": "key-)" +
             std::to_string(k % 2) + "\"}\n";
    }
    log += R"({"time": )" + std::to_string(kStart + t) +
           R"(, "remote_addr": "10.0.0.2", "path": "/v1/x"})"
           "\n";
  }
  ReplayOptions options;
  options.apply = {"api"};
  const ReplayReport r = ReplayText(ConfigOf(kLoginConfig), log, options);
  EXPECT_EQ(r.format, LogFormat::kJson);
  EXPECT_EQ(r.broken, 0);
  ASSERT_EQ(r.policies.size(), 2u);
  EXPECT_EQ(PolicyNamed(r, "login").requests, 0);  // no POST /login in this log
  const PolicyReport& api = PolicyNamed(r, "api");
  EXPECT_EQ(api.applies, "every line (--policy)");
  EXPECT_EQ(api.requests, 210);
  EXPECT_EQ(api.missing_key, 10);  // no X-Api-Key: on_missing_key deny
  EXPECT_EQ(api.keys, 2);
  // 10 a second per key at 10/s (burst 10): the bucket keeps up, nobody is limited.
  EXPECT_EQ(api.limited, 0);
}

TEST(Replay, UnknownPolicyIsAnError) {
  const std::string path = testing::TempDir() + "/empty.log";
  std::ofstream(path) << "";
  absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open(path);
  ASSERT_TRUE(in.ok());
  ReplayOptions options;
  options.apply = {"nope"};
  EXPECT_TRUE(absl::IsInvalidArgument(Replay(ConfigOf(kLoginConfig), **in, options).status()));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sluice::replay
