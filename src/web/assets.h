// The dashboard's files (web/: HTML, one JavaScript and one CSS bundle),
// built by esbuild and embedded in the binary at build time. The admin
// listener answers GET / and GET /assets/... with them; nothing is read from
// disk or fetched at run time.
//
// Thread-safe: constant data.
//
//   if (const web::Asset* a = web::FindAsset(path)) {
//     return HttpAnswer{200, a->content_type, std::string(a->body), {}};
//   }
#ifndef SLUICE_WEB_ASSETS_H_
#define SLUICE_WEB_ASSETS_H_

#include <string_view>

namespace sluice::web {

struct Asset {
  std::string_view content_type;  // with its charset, as a Content-Type field says it
  std::string_view body;
};

// The asset served at `path` ("/", "/assets/dashboard.js",
// "/assets/dashboard.css", "/assets/favicon.svg"), or nullptr. `path` is
// the target's path alone, without its query.
const Asset* FindAsset(std::string_view path);

}  // namespace sluice::web

#endif  // SLUICE_WEB_ASSETS_H_
