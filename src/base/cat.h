// Cat(...): concatenates strings and integers into one std::string, for error
// messages; Append(out, ...) appends them to `out` (no string made per
// piece, for what is built on every request). Internal. (absl::StrCat as packaged by Debian takes
// absl::string_view, a different type from std::string_view; this takes both.)
#ifndef SLUICE_BASE_CAT_H_
#define SLUICE_BASE_CAT_H_

#include <charconv>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace sluice::internal {

inline void AppendPiece(std::string& out, std::string_view s) { out.append(s); }
inline void AppendPiece(std::string& out, const char* s) { out.append(s); }
inline void AppendPiece(std::string& out, const std::string& s) { out.append(s); }
inline void AppendPiece(std::string& out, char c) { out.push_back(c); }
template <typename T>
requires std::same_as<T, absl::string_view> &&
    (!std::same_as<T, std::string_view>)inline void AppendPiece(std::string& out, T s) {
  out.append(s.data(), s.size());
}
template <std::integral T>
requires(!std::same_as<T, char> && !std::same_as<T, bool>) inline void AppendPiece(std::string& out,
                                                                                   T value) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, static_cast<size_t>(end - buf));  // (not the iterator overload)
}

// The most characters a piece appends: with it, Cat allocates once.
inline size_t PieceSize(std::string_view s) { return s.size(); }
inline size_t PieceSize(const char* s) { return std::char_traits<char>::length(s); }
inline size_t PieceSize(const std::string& s) { return s.size(); }
inline size_t PieceSize(char) { return 1; }
template <typename T>
requires std::same_as<T, absl::string_view> &&(!std::same_as<T, std::string_view>)inline size_t
    PieceSize(T s) {
  return s.size();
}
template <std::integral T>
requires(!std::same_as<T, char> && !std::same_as<T, bool>) inline size_t PieceSize(T) {
  return 20;  // 2^64 has 20 digits; a signed value has 19 and its sign
}

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  out.reserve((size_t{0} + ... + PieceSize(args)));
  (AppendPiece(out, args), ...);
  return out;
}

template <typename... Args>
void Append(std::string& out, const Args&... args) {
  (AppendPiece(out, args), ...);
}

// "host:port", an IPv6 literal in brackets ("[::1]:8080"), as an address
// is written to be read back.
inline std::string HostAndPort(std::string_view host, uint16_t port) {
  return host.find(':') != std::string_view::npos ? Cat("[", host, "]:", port)
                                                  : Cat(host, ":", port);
}

}  // namespace sluice::internal

#endif  // SLUICE_BASE_CAT_H_
