// The built dashboard files, as bytes in the binary: defined in a source
// that the build generates from web/ (src/web/embed.cmake). Use FindAsset
// (assets.h), which adds the paths and content types.
#ifndef SLUICE_WEB_EMBEDDED_H_
#define SLUICE_WEB_EMBEDDED_H_

#include <string_view>

namespace sluice::web::internal {

// The file `name` of the build's output ("index.html", "dashboard.js", ...),
// or an empty view when there is none.
std::string_view EmbeddedFile(std::string_view name);

}  // namespace sluice::web::internal

#endif  // SLUICE_WEB_EMBEDDED_H_
