#include "policy/request_text.h"

#include <gtest/gtest.h>

#include <random>
#include <string_view>
#include <utility>

namespace sluice::policy {
namespace {

// A path already in normal form is returned as it is, without the segment
// walk; the walk must agree. "/." before a path sends it down the walk and
// changes nothing else, so both ways are compared on random paths.
TEST(NormalizePath, APathAlreadyNormalIsWhatTheFullWalkMakesOfIt) {
  const std::string alphabet = "//..%6cA-_~z9;\\(S)";
  std::mt19937 rng(17);
  int normal = 0;
  for (int n = 0; n < 20000; ++n) {
    std::string path = "/";
    const int length = static_cast<int>(rng() % 12);
    for (int i = 0; i < length; ++i) path.push_back(alphabet[rng() % alphabet.size()]);
    const std::string walked = NormalizePath("/." + path);
    EXPECT_EQ(NormalizePath(path), walked) << path;
    if (walked == path) ++normal;
  }
  EXPECT_GT(normal, 1000);  // the fast case was exercised
  for (const std::string_view path : {"/", "/a", "/a/", "/a/b", "/a.b/..c/...", "/.a/b./"}) {
    EXPECT_EQ(NormalizePath(path), path);
  }
  for (const std::string_view path :
       {"//", "/a//", "/a/.", "/a/..", "/%61", "/a/./b", "a", "/a;b", "/a\\b", "/(S(x))/a"}) {
    EXPECT_NE(NormalizePath(path), path) << path;
  }
}

TEST(NormalizePath, ResolvesWhatWouldEvadeAPathPolicy) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"/login", "/login"},
      {"/%6Cogin", "/login"},
      {"/%6cogin", "/login"},
      {"//login", "/login"},
      {"/./login", "/login"},
      {"/x/../login", "/login"},
      {"/../../login", "/login"},
      {"/a/b/", "/a/b/"},
      {"", "/"},
      {"/", "/"},
      // A segment's parameters, as Tomcat and Jetty drop them before
      // mapping a path.
      {"/;x/login", "/login"},
      {"/x/..;/login", "/login"},
      {"/x/.;y/login", "/x/login"},
      {"/login;jsessionid=1", "/login"},
      {"/login;1/", "/login/"},
      {"/a;b;c/d", "/a/d"},
      // A backslash, as IIS reads it.
      {"/\\login", "/login"},
      {"\\login", "/login"},
      {"/x\\..\\login", "/login"},
      {"/api\\v1", "/api/v1"},
      // A segment of ASP.NET's cookieless tickets, which IIS never maps.
      {"/(S(x))/login", "/login"},
      {"/app/(X(1)S(abc))/login.aspx", "/app/login.aspx"},
      {"/(a(x)F(y))/login", "/login"},
      {"/(S())/login;x", "/login"},
      {"/(S(x))", "/"},
      // Not tickets: kept.
      {"/(S(x)/login", "/(S(x)/login"},
      {"/(Sx)/login", "/(Sx)/login"},
      {"/(S(x)y)/login", "/(S(x)y)/login"},
      {"/(1(x))/login", "/(1(x))/login"},
      {"/(S(a(b)))/login", "/(S(a(b)))/login"},
  };
  for (const auto& [raw, normal] : cases) EXPECT_EQ(NormalizePath(raw), normal) << raw;
}

TEST(NormalizePath, KeepsReservedEscapesEncoded) {
  // %2F is a slash inside a segment, not a separator; %25 is a literal '%'.
  EXPECT_EQ(NormalizePath("/a%2Fb"), "/a%2Fb");
  EXPECT_EQ(NormalizePath("/100%25"), "/100%25");
  EXPECT_EQ(NormalizePath("/bad%zz"), "/bad%zz");
  EXPECT_EQ(NormalizePath("/end%4"), "/end%4");
}

TEST(PlainPath, ReadsThePathAsNginxDoes) {
  // NGINX 1.22 serves each of these from `location /login` (its $uri on
  // the right): every escape decoded, then slashes merged and dot
  // segments applied; a segment's parameters and a backslash are kept.
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"/login", "/login"},
      {"/%2Flogin", "/login"},
      {"/%2flogin", "/login"},
      {"/x/..%2Flogin", "/login"},
      {"/x%2F..%2Flogin", "/login"},
      {"/x/%2e%2e/login", "/login"},
      {"/login/..;/", "/login/..;/"},
      {"/login;x", "/login;x"},
      {"/login\\..\\x", "/login\\..\\x"},
      {"/../../login", "/login"},
      {"", "/"},
      {"/a/b/", "/a/b/"},
      // A bad escape is left as sent (NGINX refuses the request).
      {"/login/%zz/..", "/login"},
      {"/a/%zz/../b", "/a/b"},
      {"/a%zz/b", "/a%zz/b"},
  };
  for (const auto& [raw, plain] : cases) EXPECT_EQ(PlainPath(raw), plain) << raw;
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
           R"([{"policy":"p","key":"k"}])",           // a batch
           R"({"policy":"p"})",                       // key missing
           R"({"policy":"p","key":"k","cost":-1})",   // negative
           R"({"policy":"p","key":"k","cost":1.5})",  // fraction
           R"({"policy":"p","key":"k","cost":1e3})",  // exponent
           R"({"policy":"p","key":"k","cost":01})",   // leading zero
           R"({"policy":"p","key":"k","cost":"3"})",  // string cost
           R"({"policy":"p","key":"k","cost":99999999999999999999})",
           R"({"policy":"p","key":"k\"x"})",  // an escape
           R"({"policy":"p","key":"caf\u00e9"})",
           R"({"policy":"p","key":"k","key":"j"})",  // repeated field
           R"({"policy":"p","key":"k","extra":1})",  // unknown field
           R"({"policy":"p","key":"k"} trailing)",
           R"({"policy":"p","key":"k",})",
           "",
       }) {
    EXPECT_EQ(ParseFlatCheck(body), std::nullopt) << body;
  }
}

TEST(TargetPath, SchemeInAnyCaseRegressionForAPolicyDodge) {
  // "GET HTTP://h/login" once reached the upstream as /login while the
  // /login policy saw the whole URL as its path.
  EXPECT_EQ(TargetPath("HTTP://h/login"), "/login");
  EXPECT_EQ(TargetPath("hTtPs://h:443/login?x=1"), "/login");
  EXPECT_EQ(TargetPath("http://h?x=/login"), "/");
  EXPECT_EQ(TargetPath("http://h"), "/");
}

TEST(TargetAuthority, OnlyForAbsoluteHttpTargets) {
  EXPECT_EQ(TargetAuthority("HTTP://Example.com:8080/a"), "Example.com:8080");
  EXPECT_EQ(TargetAuthority("https://h?q"), "h");
  EXPECT_EQ(TargetAuthority("/login"), std::nullopt);
  EXPECT_EQ(TargetAuthority("ftp://h/login"), std::nullopt);
  EXPECT_EQ(TargetAuthority("*"), std::nullopt);
}

TEST(HostName, DropsPortAndUserInformation) {
  EXPECT_EQ(HostName("example.com:8080"), "example.com");
  EXPECT_EQ(HostName("[::1]:80"), "[::1]");
  EXPECT_EQ(HostName("user:pw@example.com:80"), "example.com");
  EXPECT_EQ(HostName(""), "");
  // A fully qualified name is the same name.
  EXPECT_EQ(HostName("example.com."), "example.com");
  EXPECT_EQ(HostName("example.com.:80"), "example.com");
  EXPECT_EQ(HostName("."), ".");
}

TEST(JsonDepthWithin, CountsOnlyBracketsOutsideStrings) {
  EXPECT_TRUE(JsonDepthWithin(R"([{"policy":"p","key":"[[[[[[[[[[","cost":1}])", 2));
  EXPECT_FALSE(JsonDepthWithin("[[[", 2));
  EXPECT_TRUE(JsonDepthWithin(R"({"k":"\"[[[["})", 1));
  EXPECT_FALSE(JsonDepthWithin(std::string(1'048'000, '['), kMaxJsonDepth));
  EXPECT_TRUE(JsonDepthWithin("", kMaxJsonDepth));
}

TEST(BearerTokenIn, AcceptsOnlyAConfiguredToken) {
  const std::vector<std::string> tokens = {"first-token-0123456789", "second-token-abcdefgh"};
  EXPECT_TRUE(BearerTokenIn(tokens, "Bearer first-token-0123456789"));
  EXPECT_TRUE(BearerTokenIn(tokens, "bearer second-token-abcdefgh"));
  EXPECT_FALSE(BearerTokenIn(tokens, "Bearer first-token-012345678"));
  EXPECT_FALSE(BearerTokenIn(tokens, "Bearer first-token-0123456789x"));
  EXPECT_FALSE(BearerTokenIn(tokens, "Basic first-token-0123456789"));
  EXPECT_FALSE(BearerTokenIn(tokens, "Bearer "));
  EXPECT_FALSE(BearerTokenIn(tokens, ""));
  EXPECT_FALSE(BearerTokenIn({}, "Bearer first-token-0123456789"));
}

TEST(TargetQuery, TheQueryWithoutItsMarkOrFragment) {
  EXPECT_EQ(TargetQuery("/p?a=1&b=2"), "a=1&b=2");
  EXPECT_EQ(TargetQuery("/p?a=1#f"), "a=1");
  EXPECT_EQ(TargetQuery("http://h/p?_method=PUT"), "_method=PUT");
  EXPECT_EQ(TargetQuery("/p"), "");
  EXPECT_EQ(TargetQuery("/p?"), "");
}

}  // namespace
}  // namespace sluice::policy
