#include "server/json_body.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

std::optional<std::string> Twice(std::string_view body) {
  std::optional<std::string> twice;
  const nlohmann::json json = ParseJsonBody(body, twice);
  EXPECT_EQ(json.is_discarded(), twice.has_value()) << body;
  return twice;
}

TEST(JsonBody, AMemberNamedTwiceInOneObjectIsRefused) {
  EXPECT_EQ(Twice(R"({"policy": "a", "key": "x", "key": "y"})"), "key");
  EXPECT_EQ(Twice(R"({"k\u0065y": "x", "key": "y"})"), "key");  // the same name, escaped
  EXPECT_EQ(Twice(R"([{"key": "x"}, {"cost": 1, "cost": 2}])"), "cost");
  EXPECT_EQ(Twice(R"({"a": {"b": 1, "b": 2}})"), "b");
  EXPECT_EQ(Twice(R"({"a": [{"b": 1}, {"c": {"d": 1, "d": 2}}], "e": 1})"), "d");
}

TEST(JsonBody, ANameInDifferentObjectsIsNotTwice) {
  EXPECT_EQ(Twice(R"({"policy": "a", "key": "x", "cost": 1})"), std::nullopt);
  EXPECT_EQ(Twice(R"([{"key": "x"}, {"key": "y"}])"), std::nullopt);
  EXPECT_EQ(Twice(R"({"a": {"a": {"a": 1}}, "b": {"a": 2}})"), std::nullopt);
  EXPECT_EQ(Twice(R"({"Key": 1, "key": 2})"), std::nullopt);  // names are compared with their case
  std::optional<std::string> twice;
  EXPECT_TRUE(ParseJsonBody("{", twice).is_discarded());  // not JSON
  EXPECT_EQ(twice, std::nullopt);
}

}  // namespace
}  // namespace sluice::server
