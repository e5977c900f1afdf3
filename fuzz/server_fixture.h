// The fixed world the HTTP fuzz targets (http_request, check_body) decide
// in, and the steps of server.cc they take, without a socket or an event
// loop: one config (routes, trusted proxies, policies keyed on client_ip, a
// header, the path and the route, one of every algorithm) over a memory
// store whose clock stands still, built once per process.
//
// The server runs these steps inside coroutines; the same functions are
// called here in the same order: policy::Evaluate (EvaluateNow: every limit
// is in process) and the decision API's reading and writing
// (src/server/check_api.h).
//
// Thread-safety: one fuzzing thread.
#ifndef SLUICE_FUZZ_SERVER_FIXTURE_H_
#define SLUICE_FUZZ_SERVER_FIXTURE_H_

#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include "absl/types/span.h"
#include "policy/policy_set.h"

namespace sluice::fuzz {

// Feeds `parser` (a Beast parser) the bytes of `rest`, moving `rest` past
// what it used, as a connection that ends after them: true when the parser
// then holds a whole message; false for a malformed or incomplete one.
template <typename Parser>
bool Feed(Parser& parser, boost::asio::const_buffer& rest) {
  boost::system::error_code ec;
  while (!parser.is_done()) {
    const size_t used = parser.put(rest, ec);
    rest += used;
    if (ec && ec != boost::beast::http::error::need_more) return false;
    if (used > 0 && rest.size() > 0) continue;
    // Nothing more to give: the connection ends here.
    ec = {};
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return false;
  }
  return true;
}

// Which header client_ip believes from a trusted proxy: the fixed config
// comes in two variants, the same but for real_ip_header.
enum class RealIp { kXForwardedFor, kForwarded };

// The policies of the fixed config; aborts if it does not load.
const policy::PolicySet& Policies(RealIp real_ip = RealIp::kXForwardedFor);

// The peers a request is decided from: one inside trusted_proxies (whose
// real_ip_header counts) and one outside.
inline constexpr std::string_view kTrustedPeer = "10.1.2.3";
inline constexpr std::string_view kUntrustedPeer = "198.51.100.7";

// Decides a gateway or auth_request request as the server does: each
// applying policy's key (Policy::KeyFor), policy::Evaluate, and the
// RateLimit fields and problem document of the verdict. `applying`
// comes from `set`. Traps if client_ip is anything but the peer or, from
// kTrustedPeer, an address.
void DecideRequest(const policy::PolicySet& set, absl::Span<const policy::Policy* const> applying,
                   const policy::RequestFacts& facts, std::string_view route);

// A POST /v1/check body, as the check endpoint does: ReadCheckBody (the
// flat fast path, else the depth bound, nlohmann::json and each check's
// fields), then each check prepared, decided and written.
void DecideCheckBody(std::string_view body);

// GET /v1/keys/{policy}/{key} on the admin listener: the percent-decoded
// policy and key, and the limiter's view of that key.
void InspectKey(std::string_view rest);

}  // namespace sluice::fuzz

#endif  // SLUICE_FUZZ_SERVER_FIXTURE_H_
