// Fuzz target: the body of POST /v1/sim on the admin listener
// (server::ParseSimRequest): the JSON wrapper, a built-in scenario by name
// or a scenario file inside it (sim::ParseScenario), the seed and the
// limiters kept. Nothing is simulated: what is checked is that whatever is
// accepted is within the bounds that keep one simulation over HTTP short.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/sim_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice::server;
  // A larger body is refused before it is read (413).
  if (size > kMaxSimBodyBytes) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SimRequest> request = ParseSimRequest(body);
  if (!request.ok()) return 0;
  const sluice::sim::Scenario& s = request->scenario;
  int64_t clients = 0;
  for (const sluice::sim::ClientGroup& g : s.groups) clients += g.clients;
  if (clients > kMaxSimClients || s.limiters.empty() || s.limiters.size() > kMaxSimLimiters ||
      s.instances > kMaxSimInstances || s.max_attempts != kMaxSimAttempts) {
    std::abort();  // accepted beyond the bounds: a simulation could run for minutes
  }
  return 0;
}
