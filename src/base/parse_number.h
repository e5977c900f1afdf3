// ParseWhole: a whole decimal number that is the entire text, nothing else
// (no sign for unsigned types, no spaces, no overflow). Internal.
//
//   uint16_t port;
//   if (!internal::ParseWhole("6379", port)) { ... }
#ifndef SLUICE_BASE_PARSE_NUMBER_H_
#define SLUICE_BASE_PARSE_NUMBER_H_

#include <charconv>
#include <string_view>
#include <system_error>

namespace sluice::internal {

template <typename T>
bool ParseWhole(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

}  // namespace sluice::internal

#endif  // SLUICE_BASE_PARSE_NUMBER_H_
