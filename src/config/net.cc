// Addresses in the config: "host:port" listeners and upstreams, CIDR networks
// for trusted_proxies. inet_pton does the address parsing; what is here is the
// splitting around it and the messages.
#include "sluice/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "base/cat.h"

namespace sluice {
namespace {

using internal::Cat;

constexpr size_t kMaxHostLength = 253;  // the DNS limit on a full name

bool AllDigitsAndDots(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '.' || (c >= '0' && c <= '9'); });
}

// Letters, digits, '-', '.', '_': DNS names plus the underscore some internal
// names carry.
bool IsHostName(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  });
}

std::optional<std::array<uint8_t, 16>> ParseIpv4(const std::string& text) {
  std::array<uint8_t, 4> v4{};
  if (inet_pton(AF_INET, text.c_str(), v4.data()) != 1) return std::nullopt;
  std::array<uint8_t, 16> ip{};
  ip[10] = 0xff;
  ip[11] = 0xff;
  std::copy(v4.begin(), v4.end(), ip.begin() + 12);
  return ip;
}

std::optional<std::array<uint8_t, 16>> ParseIpv6(const std::string& text) {
  std::array<uint8_t, 16> ip{};
  if (inet_pton(AF_INET6, text.c_str(), ip.data()) != 1) return std::nullopt;
  return ip;
}

// Decimal digits only: no sign, no spaces, no hex.
std::optional<int64_t> ParseDecimal(std::string_view text, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  if (value > max) return std::nullopt;
  return value;
}

}  // namespace

std::string HostPortText(const HostPort& address, uint16_t default_port) {
  std::string text = internal::HostAndPort(address.host, address.port);
  if (default_port != 0 && address.port == default_port) text.resize(text.rfind(':'));
  return text;
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": missing ']' after the IPv6 address"));
    }
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty()) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": missing port (expected [IPv6]:PORT, e.g. [::1]:8080)"));
    }
    if (rest.front() != ':') {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": expected ':' and a port after ']'"));
    }
    port_text = rest.substr(1);
    if (!ParseIpv6(std::string(host))) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": \"", host, "\" is not an IPv6 address"));
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos && !text.empty() && AllDigitsAndDots(text) &&
        text.find('.') == std::string_view::npos) {
      return absl::InvalidArgumentError(Cat(
          "address \"", text, "\": missing host (expected HOST:PORT, e.g. 127.0.0.1:", text, ")"));
    }
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": missing port (expected HOST:PORT, e.g. 127.0.0.1:8080)"));
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": an IPv6 address needs brackets, e.g. [::1]:8080"));
    }
    if (host.empty()) {
      return absl::InvalidArgumentError(
          Cat("address \"", text,
              "\": missing host (use 0.0.0.0 for every IPv4 interface, [::] for IPv6)"));
    }
    if (host.size() > kMaxHostLength || !IsHostName(host)) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": \"", host, "\" is not a host name or IP address"));
    }
    if (AllDigitsAndDots(host) && !ParseIpv4(std::string(host))) {
      return absl::InvalidArgumentError(
          Cat("address \"", text, "\": \"", host, "\" is not an IPv4 address"));
    }
  }
  if (port_text.empty()) {
    return absl::InvalidArgumentError(Cat("address \"", text, "\": missing port after ':'"));
  }
  const std::optional<int64_t> port = ParseDecimal(port_text, 65535);
  if (!port) {
    return absl::InvalidArgumentError(
        Cat("address \"", text, "\": port \"", port_text, "\" is not a number from 0 to 65535"));
  }
  return HostPort{std::string(host), static_cast<uint16_t>(*port)};
}

std::optional<std::array<uint8_t, 16>> ParseIp(std::string_view text) {
  const std::string s(text);
  if (std::optional<std::array<uint8_t, 16>> ip = ParseIpv4(s)) return ip;
  return ParseIpv6(s);
}

absl::StatusOr<Cidr> ParseCidr(std::string_view text) {
  const size_t slash = text.find('/');
  const std::string address_text(text.substr(0, slash));
  Cidr cidr;
  int max_prefix = 128;
  int offset = 0;  // an IPv4 prefix counts from bit 96 of the mapped form
  if (std::optional<std::array<uint8_t, 16>> v4 = ParseIpv4(address_text)) {
    cidr.address = *v4;
    max_prefix = 32;
    offset = 96;
  } else if (std::optional<std::array<uint8_t, 16>> v6 = ParseIpv6(address_text)) {
    cidr.address = *v6;
  } else {
    return absl::InvalidArgumentError(
        Cat("network \"", text, "\": \"", address_text, "\" is not an IPv4 or IPv6 address"));
  }
  int prefix = max_prefix;
  if (slash != std::string_view::npos) {
    const std::optional<int64_t> parsed = ParseDecimal(text.substr(slash + 1), max_prefix);
    if (!parsed) {
      return absl::InvalidArgumentError(Cat("network \"", text, "\": prefix length \"",
                                            text.substr(slash + 1), "\" is not a number from 0 to ",
                                            max_prefix));
    }
    prefix = static_cast<int>(*parsed);
  }
  cidr.prefix_length = offset + prefix;
  // Host bits below the prefix are cleared ("10.0.0.1/8" is 10.0.0.0/8), so
  // equal networks compare equal.
  for (int bit = cidr.prefix_length; bit < 128; ++bit) {
    cidr.address[bit / 8] &= static_cast<uint8_t>(~(0x80u >> (bit % 8)));
  }
  return cidr;
}

bool Cidr::Contains(const std::array<uint8_t, 16>& ip) const {
  const int bits = std::clamp(prefix_length, 0, 128);
  const int whole = bits / 8;
  if (std::memcmp(ip.data(), address.data(), whole) != 0) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xffu << (8 - rest));
  return (ip[whole] & mask) == (address[whole] & mask);
}

}  // namespace sluice
