// The body of POST /v1/sim on the admin listener: a built-in scenario's
// name or a scenario file, a seed, the limiters to run, read within the
// bounds that keep one simulation asked for over HTTP to a few seconds.
// Anyone who reaches the admin listener may send one, so every field is
// checked here, before anything is simulated (fuzzed: fuzz/sim_request.cc).
//
//   absl::StatusOr<SimRequest> r = ParseSimRequest(R"({"scenario": "login-storm"})");
#ifndef SLUICE_SERVER_SIM_REQUEST_H_
#define SLUICE_SERVER_SIM_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "sim/scenario.h"

namespace sluice::server {

// Bounds of one simulation asked for over HTTP: the work (events) and
// memory (clients) of a run, and so its time: well under a second for the
// built-in scenarios, a few seconds at worst, on a thread of its own.
inline constexpr size_t kMaxSimBodyBytes = 64 * 1024;  // larger: 413, before parsing
inline constexpr int64_t kMaxSimAttempts = 1'000'000;  // requests and retries per limiter
inline constexpr int64_t kMaxSimClients = 100'000;
inline constexpr size_t kMaxSimLimiters = 8;
inline constexpr int64_t kMaxSimInstances = 64;

struct SimRequest {
  sim::Scenario scenario;  // its max_attempts is kMaxSimAttempts
  uint64_t seed = 1;
};

// The scenario `body` names or holds. InvalidArgument for a body that is
// wrong; OutOfRange for a scenario beyond the bounds above.
absl::StatusOr<SimRequest> ParseSimRequest(std::string_view body);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SIM_REQUEST_H_
