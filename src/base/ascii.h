// AsciiLower(s): `s` with A-Z as a-z, the rest untouched, for header names,
// hosts and config words. Internal. (absl::AsciiStrToLower as packaged by
// Debian takes absl::string_view, a different type from std::string_view.)
#ifndef SLUICE_BASE_ASCII_H_
#define SLUICE_BASE_ASCII_H_

#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace sluice::internal {

inline std::string AsciiLower(std::string_view s) {
  std::string out(s);
  absl::AsciiStrToLower(&out);
  return out;
}

// Whether `a` and `b` are equal with A-Z and a-z read alike.
inline bool AsciiEqualsIgnoreCase(std::string_view a, std::string_view b) {
  return absl::EqualsIgnoreCase(absl::string_view(a.data(), a.size()),
                                absl::string_view(b.data(), b.size()));
}

}  // namespace sluice::internal

#endif  // SLUICE_BASE_ASCII_H_
