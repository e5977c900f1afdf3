#include "web/assets.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <utility>

namespace sluice::web {
namespace {

TEST(AssetsTest, ThePageLoadsTheBundleFromTheAssets) {
  const Asset* page = FindAsset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<!doctype html>"), std::string_view::npos);
  EXPECT_NE(page->body.find("src=\"/assets/dashboard.js\""), std::string_view::npos);
  EXPECT_NE(page->body.find("href=\"/assets/dashboard.css\""), std::string_view::npos);
}

TEST(AssetsTest, EveryAssetIsBuiltAndTyped) {
  for (const auto& [path, type] :
       {std::pair{"/assets/dashboard.js", "text/javascript; charset=utf-8"},
        std::pair{"/assets/dashboard.css", "text/css; charset=utf-8"},
        std::pair{"/assets/favicon.svg", "image/svg+xml"}}) {
    const Asset* a = FindAsset(path);
    ASSERT_NE(a, nullptr) << path;
    EXPECT_EQ(a->content_type, type) << path;
    EXPECT_GT(a->body.size(), 100u) << path;
  }
  // The bundle holds uPlot and its CSS (no CDN: the page loads nothing else).
  EXPECT_NE(FindAsset("/assets/dashboard.js")->body.find("uplot"), std::string_view::npos);
  EXPECT_NE(FindAsset("/assets/dashboard.css")->body.find(".u-legend"), std::string_view::npos);
}

// Whether `html` has an attribute like onclick= (an inline handler).
bool HasInlineHandler(std::string_view html) {
  for (size_t at = html.find(" on"); at != std::string_view::npos; at = html.find(" on", at + 1)) {
    size_t end = at + 3;
    while (end < html.size() && std::islower(static_cast<unsigned char>(html[end]))) ++end;
    if (end > at + 3 && end < html.size() && html[end] == '=') return true;
  }
  return false;
}

TEST(AssetsTest, ThePageRunsNoInlineScriptOrStyle) {
  // The admin listener sends a CSP without 'unsafe-inline'.
  const std::string_view page = FindAsset("/")->body;
  EXPECT_EQ(page.find("<script>"), std::string_view::npos);
  EXPECT_EQ(page.find("<style"), std::string_view::npos);
  EXPECT_EQ(page.find("style="), std::string_view::npos);
  EXPECT_FALSE(HasInlineHandler(page));
  EXPECT_EQ(page.find("http://"), std::string_view::npos);
  EXPECT_EQ(page.find("https://"), std::string_view::npos);
}

TEST(AssetsTest, OtherPathsAreNotAssets) {
  EXPECT_EQ(FindAsset(""), nullptr);
  EXPECT_EQ(FindAsset("/index.html"), nullptr);
  EXPECT_EQ(FindAsset("/assets/"), nullptr);
  EXPECT_EQ(FindAsset("/assets/../index.html"), nullptr);
  EXPECT_EQ(FindAsset("/assets/dashboard.js/"), nullptr);
  EXPECT_EQ(FindAsset("/v1/config"), nullptr);
}

}  // namespace
}  // namespace sluice::web
