#include "server/request_text.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

TEST(NormalizePath, ResolvesWhatWouldEvadeAPathPolicy) {
  EXPECT_EQ(NormalizePath("/login"), "/login");
  EXPECT_EQ(NormalizePath("/%6Cogin"), "/login");
  EXPECT_EQ(NormalizePath("/%6cogin"), "/login");
  EXPECT_EQ(NormalizePath("//login"), "/login");
  EXPECT_EQ(NormalizePath("/./login"), "/login");
  EXPECT_EQ(NormalizePath("/x/../login"), "/login");
  EXPECT_EQ(NormalizePath("/../../login"), "/login");
  EXPECT_EQ(NormalizePath("/a/b/"), "/a/b/");
  EXPECT_EQ(NormalizePath(""), "/");
  EXPECT_EQ(NormalizePath("/"), "/");
}

TEST(NormalizePath, KeepsReservedEscapesEncoded) {
  // %2F is a slash inside a segment, not a separator; %25 is a literal '%'.
  EXPECT_EQ(NormalizePath("/a%2Fb"), "/a%2Fb");
  EXPECT_EQ(NormalizePath("/100%25"), "/100%25");
  EXPECT_EQ(NormalizePath("/bad%zz"), "/bad%zz");
  EXPECT_EQ(NormalizePath("/end%4"), "/end%4");
}

TEST(TargetPath, TakesThePathOfOriginAndAbsoluteForms) {
  EXPECT_EQ(TargetPath("/a/b?x=1"), "/a/b");
  EXPECT_EQ(TargetPath("/a#frag"), "/a");
  EXPECT_EQ(TargetPath("http://example.com/login?x"), "/login");
  EXPECT_EQ(TargetPath("http://example.com"), "/");
}

TEST(PercentDecode, DecodesEverythingOrFails) {
  EXPECT_EQ(*PercentDecode("a%7Cb%20c"), "a|b c");
  EXPECT_EQ(PercentDecode("%"), std::nullopt);
  EXPECT_EQ(PercentDecode("%4"), std::nullopt);
  EXPECT_EQ(PercentDecode("%GG"), std::nullopt);
}

TEST(ParseFlatCheck, ReadsTheCommonShape) {
  std::optional<FlatCheck> c = ParseFlatCheck(R"({"policy": "api", "key": "user-42", "cost": 3})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->policy, "api");
  EXPECT_EQ(c->key, "user-42");
  EXPECT_EQ(c->cost, 3);
  c = ParseFlatCheck(" {\n\"key\":\"k\",\t\"policy\":\"p\"} \n");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->cost, 1);
  EXPECT_EQ(ParseFlatCheck(R"({"policy":"p","key":"k","cost":0})")->cost, 0);
}

TEST(ParseFlatCheck, LeavesEverythingElseToTheFullParser) {
  for (const char* body : {
           R"([{"policy":"p","key":"k"}])",                 // a batch
           R"({"policy":"p"})",                              // key missing
           R"({"policy":"p","key":"k","cost":-1})",         // negative
           R"({"policy":"p","key":"k","cost":1.5})",        // fraction
           R"({"policy":"p","key":"k","cost":1e3})",        // exponent
           R"({"policy":"p","key":"k","cost":01})",         // leading zero
           R"({"policy":"p","key":"k","cost":"3"})",        // string cost
           R"({"policy":"p","key":"k","cost":99999999999999999999})",
           R"({"policy":"p","key":"k\"x"})",                // an escape
           R"({"policy":"p","key":"caf\u00e9"})",
           R"({"policy":"p","key":"k","key":"j"})",         // repeated field
           R"({"policy":"p","key":"k","extra":1})",         // unknown field
           R"({"policy":"p","key":"k"} trailing)",
           R"({"policy":"p","key":"k",})",
           "",
       }) {
    EXPECT_EQ(ParseFlatCheck(body), std::nullopt) << body;
  }
}

}  // namespace
}  // namespace sluice::server
