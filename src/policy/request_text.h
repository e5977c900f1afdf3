// Reading request text: paths as an origin server sees them, percent
// escapes, and the decision API's common body. Internal to the server; pure
// functions, unit-tested in request_text_test.cc.
#ifndef SLUICE_POLICY_REQUEST_TEXT_H_
#define SLUICE_POLICY_REQUEST_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::policy {

// The value of `digits`, one to eight hex digits; nullopt if any is not one.
std::optional<uint32_t> HexValue(std::string_view digits);

// The byte "%XX" at s[i] stands for, if it is one.
std::optional<char> PercentByte(std::string_view s, size_t i);

// Percent-decoding for /v1/keys/{policy}/{key}; nullopt for a bad escape.
std::optional<std::string> PercentDecode(std::string_view s);

// The path policies and routes match on, as an origin server would see it:
// percent-encoded unreserved characters decoded, a backslash read as a
// slash (IIS), each segment's parameters (";...", Tomcat and Jetty)
// dropped, a segment of ASP.NET's cookieless tickets ("(S(...))", IIS)
// dropped, empty and "." segments dropped, ".." applied. Otherwise
// "/%6Cogin", "//login", "/x/../login", "/\\login", "/;x/login" or
// "/x/..;/login" would slip past a policy on /login that the upstream then
// serves, and "/login;1", "/login;2" ... would each be a key of their own.
// Where an origin reads a path more narrowly, a policy counts more of its
// requests than it must, never fewer.
std::string NormalizePath(std::string_view raw);

// The path as NGINX (and servers that read a path as RFC 3986 does) sees
// it: every escape decoded, `%2F` included (with a bad escape anywhere,
// none is: NGINX refuses such a request), then empty and "." segments
// dropped and ".." applied, a segment's
// parameters and a backslash kept as they are. Where NormalizePath reads
// "/login/..;/" as Tomcat does ("/"), NGINX's `location /login` serves it.
std::string PlainPath(std::string_view raw);

// The path part of a request target, origin form or absolute form
// ("http://host/path?q" -> "/path"; the scheme in any case, RFC 9110
// section 4.2.3).
std::string_view TargetPath(std::string_view target);

// The query of a request target, without its '?' ("/path?a=1#f" -> "a=1");
// empty when there is none.
std::string_view TargetQuery(std::string_view target);

// The authority of an absolute-form target ("HTTP://Host:80/x" ->
// "Host:80"); nullopt for any other form.
std::optional<std::string_view> TargetAuthority(std::string_view target);

// The host of an authority or Host header value, without port or user
// information or a name's one trailing dot ("Example.com.:80" ->
// "Example.com": otherwise "Host: api.example.com." would slip past a policy
// on api.example.com that the upstream then serves), brackets kept for IPv6
// ("[::1]:80" -> "[::1]"). Not lower-cased.
std::string_view HostName(std::string_view authority);

// The common shape of a check, {"policy": "...", "key": "...", "cost": N},
// read without building a JSON tree: the decision API's hot path. Anything
// else (escapes, other fields or types, a repeated field, a batch) returns
// nullopt and goes through nlohmann::json, which also words the errors.
struct FlatCheck {
  std::string_view policy;
  std::string_view key;
  int64_t cost = 1;
};
std::optional<FlatCheck> ParseFlatCheck(std::string_view body);

// The decision API's JSON bodies nest two levels ([{...}]); a parser that
// builds a tree spends memory and time on every level it is given, so a body
// nested deeper than `max_depth` arrays and objects is refused before it is
// parsed. One pass, no allocation; brackets inside strings do not count.
bool JsonDepthWithin(std::string_view body, int max_depth);
inline constexpr int kMaxJsonDepth = 8;

// Whether an Authorization value is "Bearer <token>" (the scheme in any
// case) for one of `tokens`. The comparison takes the same time wherever the
// first differing byte is, so the time of a refusal tells nothing of a token.
bool BearerTokenIn(const std::vector<std::string>& tokens, std::string_view authorization);

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_REQUEST_TEXT_H_
