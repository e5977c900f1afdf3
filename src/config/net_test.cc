#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/config.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

std::array<uint8_t, 16> Ip(std::string_view text) {
  std::optional<std::array<uint8_t, 16>> ip = ParseIp(text);
  EXPECT_TRUE(ip.has_value()) << text;
  return ip.value_or(std::array<uint8_t, 16>{});
}

std::string NetErrorOf(std::string_view text) {
  return std::string(ParseHostPort(text).status().message());
}

TEST(ParseHostPort, ReadsIpv4) {
  EXPECT_EQ(*ParseHostPort("127.0.0.1:8080"), (HostPort{"127.0.0.1", 8080}));
  EXPECT_EQ(*ParseHostPort("0.0.0.0:0"), (HostPort{"0.0.0.0", 0}));
  EXPECT_EQ(*ParseHostPort("10.1.2.3:65535"), (HostPort{"10.1.2.3", 65535}));
}

TEST(ParseHostPort, ReadsBracketedIpv6WithoutTheBrackets) {
  EXPECT_EQ(*ParseHostPort("[::1]:8080"), (HostPort{"::1", 8080}));
  EXPECT_EQ(*ParseHostPort("[::]:9090"), (HostPort{"::", 9090}));
  EXPECT_EQ(*ParseHostPort("[2001:db8::7]:443"), (HostPort{"2001:db8::7", 443}));
}

TEST(ParseHostPort, ReadsNames) {
  EXPECT_EQ(*ParseHostPort("localhost:80"), (HostPort{"localhost", 80}));
  EXPECT_EQ(*ParseHostPort("api-1.internal.example.com:3000"),
            (HostPort{"api-1.internal.example.com", 3000}));
}

TEST(ParseHostPort, RejectsBadPorts) {
  EXPECT_THAT(NetErrorOf("127.0.0.1:65536"),
              HasSubstr("port \"65536\" is not a number from 0 to 65535"));
  EXPECT_THAT(NetErrorOf("127.0.0.1:-1"), HasSubstr("port \"-1\""));
  EXPECT_THAT(NetErrorOf("127.0.0.1:http"), HasSubstr("port \"http\""));
  EXPECT_THAT(NetErrorOf("127.0.0.1:80 "), HasSubstr("port \"80 \""));
  EXPECT_THAT(NetErrorOf("127.0.0.1:99999999999999999999"), HasSubstr("is not a number"));
}

TEST(ParseHostPort, RejectsMissingPort) {
  EXPECT_THAT(NetErrorOf("127.0.0.1"), HasSubstr("missing port"));
  EXPECT_THAT(NetErrorOf("localhost"), HasSubstr("missing port"));
  EXPECT_THAT(NetErrorOf("127.0.0.1:"), HasSubstr("missing port"));
  EXPECT_THAT(NetErrorOf("[::1]"), HasSubstr("missing port"));
  EXPECT_THAT(NetErrorOf("8080"), HasSubstr("missing host"));
}

TEST(ParseHostPort, RejectsMalformedHosts) {
  EXPECT_THAT(NetErrorOf(":8080"), HasSubstr("missing host"));
  EXPECT_THAT(NetErrorOf("::1:8080"), HasSubstr("IPv6 address needs brackets"));
  EXPECT_THAT(NetErrorOf("[::1:8080"), HasSubstr("missing ']'"));
  EXPECT_THAT(NetErrorOf("[::1]8080"), HasSubstr("expected ':'"));
  EXPECT_THAT(NetErrorOf("[nope]:80"), HasSubstr("\"nope\" is not an IPv6 address"));
  EXPECT_THAT(NetErrorOf("256.0.0.1:80"), HasSubstr("\"256.0.0.1\" is not an IPv4 address"));
  EXPECT_THAT(NetErrorOf("exa mple.com:80"), HasSubstr("is not a host name or IP address"));
}

TEST(HostPortText, WritesWhatParseHostPortReads) {
  for (const std::string_view text : {"127.0.0.1:8080", "[::1]:8080", "localhost:80", "[::]:0"}) {
    const absl::StatusOr<HostPort> parsed = ParseHostPort(text);
    ASSERT_TRUE(parsed.ok()) << text;
    EXPECT_EQ(HostPortText(*parsed), text);
  }
  // A Host field's form: the port left out where it is the default.
  EXPECT_EQ(HostPortText({"app.internal", 80}, 80), "app.internal");
  EXPECT_EQ(HostPortText({"::1", 80}, 80), "[::1]");
  EXPECT_EQ(HostPortText({"::1", 3000}, 80), "[::1]:3000");
}

TEST(ParseIp, MapsIpv4IntoIpv6) {
  const std::array<uint8_t, 16> expected = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
  EXPECT_EQ(Ip("10.1.2.3"), expected);
  EXPECT_EQ(Ip("::ffff:10.1.2.3"), expected);
  EXPECT_EQ(Ip("::1")[15], 1);
  EXPECT_FALSE(ParseIp("10.1.2").has_value());
  EXPECT_FALSE(ParseIp("localhost").has_value());
  EXPECT_FALSE(ParseIp("").has_value());
}

TEST(ParseCidr, ReadsIpv4AsMappedWithPrefixPlus96) {
  const Cidr cidr = *ParseCidr("10.0.0.0/8");
  EXPECT_EQ(cidr.prefix_length, 104);
  EXPECT_EQ(cidr.address, Ip("10.0.0.0"));
}

TEST(ParseCidr, BareAddressIsOneHost) {
  EXPECT_EQ(ParseCidr("127.0.0.1")->prefix_length, 128);
  EXPECT_EQ(ParseCidr("::1")->prefix_length, 128);
  EXPECT_EQ(ParseCidr("::1")->address, Ip("::1"));
}

TEST(ParseCidr, ClearsHostBitsBelowThePrefix) {
  EXPECT_EQ(*ParseCidr("10.1.2.3/8"), *ParseCidr("10.0.0.0/8"));
  EXPECT_EQ(*ParseCidr("2001:db8::1/32"), *ParseCidr("2001:db8::/32"));
}

TEST(ParseCidr, RejectsBadInput) {
  EXPECT_THAT(ParseCidr("10.0.0.0/33").status().message(),
              HasSubstr("prefix length \"33\" is not a number from 0 to 32"));
  EXPECT_THAT(ParseCidr("::/129").status().message(), HasSubstr("from 0 to 128"));
  EXPECT_THAT(ParseCidr("10.0.0.0/").status().message(), HasSubstr("prefix length \"\""));
  EXPECT_THAT(ParseCidr("10.0.0.0/-1").status().message(), HasSubstr("prefix length \"-1\""));
  EXPECT_THAT(ParseCidr("10.0.0/8").status().message(),
              HasSubstr("\"10.0.0\" is not an IPv4 or IPv6 address"));
  EXPECT_THAT(ParseCidr("localhost").status().message(), HasSubstr("not an IPv4 or IPv6"));
}

TEST(CidrContains, Ipv4Network) {
  const Cidr cidr = *ParseCidr("10.0.0.0/8");
  EXPECT_TRUE(cidr.Contains(Ip("10.0.0.0")));
  EXPECT_TRUE(cidr.Contains(Ip("10.255.255.255")));
  EXPECT_FALSE(cidr.Contains(Ip("11.0.0.0")));
  EXPECT_FALSE(cidr.Contains(Ip("9.255.255.255")));
  EXPECT_FALSE(cidr.Contains(Ip("::a00:1")));  // 10.0.0.1's bits, but not IPv4-mapped
}

TEST(CidrContains, Ipv4PrefixThatSplitsAByte) {
  const Cidr cidr = *ParseCidr("192.168.4.0/22");
  EXPECT_TRUE(cidr.Contains(Ip("192.168.4.1")));
  EXPECT_TRUE(cidr.Contains(Ip("192.168.7.255")));
  EXPECT_FALSE(cidr.Contains(Ip("192.168.8.0")));
  EXPECT_FALSE(cidr.Contains(Ip("192.168.3.255")));
}

TEST(CidrContains, Ipv4SingleHost) {
  const Cidr cidr = *ParseCidr("127.0.0.1/32");
  EXPECT_TRUE(cidr.Contains(Ip("127.0.0.1")));
  EXPECT_FALSE(cidr.Contains(Ip("127.0.0.2")));
}

TEST(CidrContains, Ipv6Network) {
  const Cidr cidr = *ParseCidr("2001:db8::/32");
  EXPECT_TRUE(cidr.Contains(Ip("2001:db8::1")));
  EXPECT_TRUE(cidr.Contains(Ip("2001:db8:ffff:ffff::1")));
  EXPECT_FALSE(cidr.Contains(Ip("2001:db9::1")));
  EXPECT_FALSE(cidr.Contains(Ip("10.0.0.1")));
}

TEST(CidrContains, Ipv6SingleHost) {
  const Cidr cidr = *ParseCidr("::1");
  EXPECT_TRUE(cidr.Contains(Ip("::1")));
  EXPECT_FALSE(cidr.Contains(Ip("::2")));
}

TEST(CidrContains, MappedPrefixHoldsEveryIpv4Address) {
  const Cidr cidr = *ParseCidr("::ffff:0:0/96");
  EXPECT_EQ(cidr.prefix_length, 96);
  EXPECT_TRUE(cidr.Contains(Ip("1.2.3.4")));
  EXPECT_TRUE(cidr.Contains(Ip("255.255.255.255")));
  EXPECT_FALSE(cidr.Contains(Ip("::1")));
  EXPECT_FALSE(cidr.Contains(Ip("2001:db8::1")));
}

TEST(CidrContains, ZeroPrefixHoldsEverything) {
  const Cidr v6_all = *ParseCidr("::/0");
  EXPECT_EQ(v6_all.prefix_length, 0);
  EXPECT_TRUE(v6_all.Contains(Ip("::1")));
  EXPECT_TRUE(v6_all.Contains(Ip("1.2.3.4")));
  EXPECT_TRUE(v6_all.Contains(Ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
}

TEST(CidrContains, Ipv4ZeroPrefixHoldsEveryIpv4AddressOnly) {
  const Cidr v4_all = *ParseCidr("0.0.0.0/0");
  EXPECT_EQ(v4_all.prefix_length, 96);
  EXPECT_TRUE(v4_all.Contains(Ip("0.0.0.0")));
  EXPECT_TRUE(v4_all.Contains(Ip("255.255.255.255")));
  EXPECT_FALSE(v4_all.Contains(Ip("::1")));
}

}  // namespace
}  // namespace sluice
