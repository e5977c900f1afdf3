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

TEST(JsonBody, TheMethodsABodyNames) {
  using Methods = absl::InlinedVector<std::string, 2>;
  // Laravel reads a body as JSON when its Content-Type holds "/json" or
  // "+json" anywhere: the outermost object's `_method` strings, escaped or
  // not, every one of a name given twice.
  EXPECT_EQ(BodyMethods("application/json", R"({"a": 1, "_method": "PUT"})"), Methods{"PUT"});
  EXPECT_EQ(BodyMethods("application/vnd.api+json", R"({"\u005fmethod": "DELETE"})"),
            Methods{"DELETE"});
  EXPECT_EQ(BodyMethods("application/json", R"({"_method": "PUT", "_method": "PATCH"})"),
            (Methods{"PUT", "PATCH"}));
  EXPECT_EQ(BodyMethods("APPLICATION/JSON; charset=utf-8", R"({"_method": "PUT"})"),
            Methods{"PUT"});
  // Not the outermost object's, not a string, not JSON.
  EXPECT_EQ(BodyMethods("application/json", R"({"a": {"_method": "PUT"}})"), Methods{});
  EXPECT_EQ(BodyMethods("application/json", R"([{"_method": "PUT"}])"), Methods{});
  EXPECT_EQ(BodyMethods("application/json", R"({"_method": ["PUT"]})"), Methods{});
  EXPECT_EQ(BodyMethods("application/json", R"({"a": {"b": 1}, "_method": 7})"), Methods{});
  EXPECT_EQ(BodyMethods("application/json", "_method=PUT"), Methods{});
  EXPECT_EQ(BodyMethods("text/plain", R"({"_method": "PUT"})"), Methods{});
  // A form type that names "/json" in a parameter is read both ways.
  EXPECT_EQ(BodyMethods("application/x-www-form-urlencoded; x=/json", "_method=PUT"),
            Methods{"PUT"});
  // And a form as policy::FormMethods reads one.
  EXPECT_EQ(BodyMethods(std::nullopt, "_method=PUT"), Methods{"PUT"});
}

}  // namespace
}  // namespace sluice::server
