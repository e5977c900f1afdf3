#include "web/assets.h"

#include <array>

#include "web/embedded.h"

namespace sluice::web {
namespace {

struct Route {
  std::string_view path;
  std::string_view file;  // in the build's output (web/package.json, "build")
  std::string_view content_type;
};

constexpr std::array<Route, 4> kRoutes = {{
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/assets/dashboard.js", "dashboard.js", "text/javascript; charset=utf-8"},
    {"/assets/dashboard.css", "dashboard.css", "text/css; charset=utf-8"},
    {"/assets/favicon.svg", "favicon.svg", "image/svg+xml"},
}};

// Built once, on first use (a function-local static: thread-safe).
const std::array<Asset, kRoutes.size()>& Assets() {
  static const std::array<Asset, kRoutes.size()> assets = [] {
    std::array<Asset, kRoutes.size()> a;
    for (size_t i = 0; i < kRoutes.size(); ++i) {
      a[i] = {kRoutes[i].content_type, internal::EmbeddedFile(kRoutes[i].file)};
    }
    return a;
  }();
  return assets;
}

}  // namespace

const Asset* FindAsset(std::string_view path) {
  for (size_t i = 0; i < kRoutes.size(); ++i) {
    if (kRoutes[i].path == path) return &Assets()[i];
  }
  return nullptr;
}

}  // namespace sluice::web
