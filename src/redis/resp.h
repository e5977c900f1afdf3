// redis/resp.h: writing commands in the Redis protocol (RESP): an array of
// bulk strings. Header-only, so that code that builds commands without the
// client (the store's call encoding, its fuzz target) needs no library.
#ifndef SLUICE_REDIS_RESP_H_
#define SLUICE_REDIS_RESP_H_

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::redis {

// "<mark><n>\r\n": an array header ('*') or a bulk string's length ('$').
inline void AppendHeader(std::string& out, char mark, uint64_t n) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, n);
  out += mark;
  out.append(digits, static_cast<size_t>(end - digits));
  out += "\r\n";
}

// One argument of a command: "$<size>\r\n<bytes>\r\n".
inline void AppendBulk(std::string& out, std::string_view arg) {
  AppendHeader(out, '$', arg.size());
  out.append(arg.data(), arg.size());
  out += "\r\n";
}

// A whole command of `count` arguments.
inline void AppendCommand(std::string& out, const std::string_view* args, size_t count) {
  AppendHeader(out, '*', count);
  for (size_t i = 0; i < count; ++i) AppendBulk(out, args[i]);
}

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_RESP_H_
