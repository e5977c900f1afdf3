#include "server/sim_request.h"

#include <string>

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace sluice::server {
namespace {

std::string Body(const nlohmann::json& j) { return j.dump(); }

std::string StormYaml(int clients, int limiters) {
  std::string yaml =
      "name: storm\nduration: 1m\nclients:\n  - name: users\n    count: " +
      std::to_string(clients) +
      "\n    key: client\n    traffic:\n      - {burst: 10, at: 0s, spread: 0s}\nlimiters:\n";
  for (int i = 0; i < limiters; ++i) {
    yaml += "  - {algorithm: fixed_window, rate: " + std::to_string(i + 1) + "/min}\n";
  }
  return yaml;
}

TEST(SimRequestTest, ABuiltInByNameWithItsSeedOrTheOneGiven) {
  absl::StatusOr<SimRequest> r = ParseSimRequest(Body({{"scenario", "login-storm"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->seed, r->scenario.seed);
  EXPECT_EQ(r->scenario.max_attempts, kMaxSimAttempts);
  r = ParseSimRequest(Body({{"scenario", "login-storm"}, {"seed", 7}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->seed, 7u);
}

TEST(SimRequestTest, KeepsOnlyTheLimitersNamed) {
  absl::StatusOr<SimRequest> r =
      ParseSimRequest(Body({{"yaml", StormYaml(10, 3)}, {"limiters", {"fixed_window 2/min"}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->scenario.limiters.size(), 1u);
  EXPECT_EQ(r->scenario.limiters[0].name, "fixed_window 2/min");
  EXPECT_EQ(
      ParseSimRequest(Body({{"yaml", StormYaml(10, 3)}, {"limiters", {"nope"}}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ParseSimRequest(Body({{"yaml", StormYaml(10, 3)}, {"limiters", nlohmann::json::array()}}))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(SimRequestTest, RefusesWhatIsNotOneScenario) {
  for (const std::string& body :
       {std::string("[]"), std::string("{"), Body({{"scenario", "login-storm"}, {"yaml", "x"}}),
        Body(nlohmann::json::object()), Body({{"scenario", 1}}), Body({{"scenario", "nope"}}),
        Body({{"scenario", "login-storm"}, {"seed", -1}}),
        Body({{"scenario", "login-storm"}, {"extra", 1}}),
        std::string(R"({"scenario": "login-storm", "scenario": "sliding-window-smooths"})"),
        std::string(R"({"scenario": "login-storm", "limiters": [[[[[[[[[["x"]]]]]]]]]]})")}) {
    // Anything but OutOfRange is a 400 (bad scenario), not a 422.
    const absl::Status status = ParseSimRequest(body).status();
    EXPECT_FALSE(status.ok()) << body;
    EXPECT_NE(status.code(), absl::StatusCode::kOutOfRange) << body;
  }
}

TEST(SimRequestTest, RefusesScenariosBeyondTheBoundsOfOneOverHttp) {
  EXPECT_TRUE(ParseSimRequest(Body({{"yaml", StormYaml(kMaxSimClients, 8)}})).ok());
  EXPECT_EQ(ParseSimRequest(Body({{"yaml", StormYaml(kMaxSimClients + 1, 1)}})).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ParseSimRequest(Body({{"yaml", StormYaml(10, kMaxSimLimiters + 1)}})).status().code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace sluice::server
