#include "sim/builtin.h"

#include <array>
#include <string>

#include "base/cat.h"
#include "sim/scenario_file.h"

namespace sluice::sim {
namespace {

// The seed's login storm. Every limiter sends Retry-After without jitter so
// that the shapes differ only by algorithm; retry-wave shows what jitter does.
constexpr std::string_view kLoginStorm =
    R"yaml(# The seed's login storm: 400 logins at one instant, then nothing for 50 s,
# against a service that processes 40/s. Clients retry when Retry-After says.
# The seed's team chose fixed_window 40/min: 40 pass, 360 are rejected, and
# every rejected client is told the same instant, the next minute.
name: login-storm
description: 400 logins at one instant, then quiet, against a service that processes 40/s; clients retry as Retry-After says
duration: 10m
downstream: {capacity: 40/s}
clients:
  - name: users
    count: 400
    key: global          # the limit protects the login service as a whole
    retry: retry_after
    traffic:
      - {burst: 400, at: 0s}
limiters:
  - {name: fixed_window 40/min, algorithm: fixed_window, rate: 40/min, retry_after_jitter: 0s}
  - {name: token_bucket 40/s, algorithm: token_bucket, rate: 40/s, burst: 40, retry_after_jitter: 0s}
  - {name: gcra 40/s, algorithm: gcra, rate: 40/s, burst: 40, retry_after_jitter: 0s}
  - {name: leaky_bucket shape 40/s, algorithm: leaky_bucket, mode: shape, rate: 40/s, max_delay: 10s, retry_after_jitter: 0s}
  - {name: sliding_log 40/s, algorithm: sliding_log, rate: 40/s, retry_after_jitter: 0s}
  - {name: sliding_window 40/s, algorithm: sliding_window, rate: 40/s, retry_after_jitter: 0s}
)yaml";

constexpr std::string_view kBoundaryBurst =
    R"yaml(# The window-boundary double burst: one client sends 10/s from 10 s before a
# window boundary to 10 s after it. The clock starts at 0:59:00, so the
# boundary at 1:00:00 ends both a minute window and an hour window: the seeds'
# "40 at 0:59 and 40 at 1:00" (40/min) and "4 at 8:59 and 4 at 9:00" (4/h).
name: boundary-burst
description: one client at full throttle across a window boundary; the most admitted in any period-long interval, per algorithm
duration: 2m
clock_start: 59m
clients:
  - name: client
    count: 1
    retry: never
    traffic:
      - {constant: 10/s, from: 50s, until: 70s}
limiters:
  - {name: fixed_window 40/min, algorithm: fixed_window, rate: 40/min}
  - {name: sliding_log 40/min, algorithm: sliding_log, rate: 40/min}
  - {name: sliding_window 40/min, algorithm: sliding_window, rate: 40/min}
  - {name: token_bucket 40/min, algorithm: token_bucket, rate: 40/min}
  - {name: fixed_window 4/h, algorithm: fixed_window, rate: 4/h}
  - {name: sliding_log 4/h, algorithm: sliding_log, rate: 4/h}
)yaml";

constexpr std::string_view kRetryWave =
    R"yaml(# The synchronized retry wave: 1000 clients arrive within one second at a
# limit of 50/s. Told one identical Retry-After, the rejected come back
# together, second after second; told a jittered one, or backing off on
# their own with full jitter, they spread out.
name: retry-wave
description: 1000 clients at once against 50/s; one identical Retry-After versus a jittered one versus client backoff
duration: 1m
downstream: {capacity: 50/s}
clients:
  - name: clients
    count: 1000
    key: global
    retry: retry_after
    traffic:
      - {burst: 1000, at: 0s, spread: 1s}
limiters:
  - {name: identical Retry-After, algorithm: token_bucket, rate: 50/s, retry_after_jitter: 0s}
  - {name: Retry-After + 10s jitter, algorithm: token_bucket, rate: 50/s, retry_after_jitter: 10s}
  - name: client backoff (full jitter)
    algorithm: token_bucket
    rate: 50/s
    retry: {policy: backoff, base: 1s, cap: 30s}
)yaml";

constexpr std::string_view kFleet =
    R"yaml(# The seeds' knowledge check: 6 instances each run a local limit of 100/min
# behind a round-robin balancer; the upstream takes at most 300/min. Local
# state lets 6 x 100 through; one shared state holds the fleet to 300.
name: fleet
description: 6 instances with local 100/min limits versus one shared 300/min limit, against an upstream that takes 300/min
duration: 6m
instances: 6
downstream: {capacity: 300/min}
contract: 300/min        # the upstream's ceiling
clients:
  - name: callers
    count: 500
    key: global
    retry: never
    traffic:
      - {poisson: 900/min}
limiters:
  - {name: local 100/min x6, algorithm: token_bucket, rate: 100/min, scope: local}
  - {name: shared 300/min, algorithm: token_bucket, rate: 300/min, scope: global}
  - {name: local 50/min x6, algorithm: token_bucket, rate: 50/min, scope: local}
)yaml";

constexpr std::array<BuiltinScenario, 4> kBuiltins = {{
    {"login-storm", "400 logins at one instant against 40/s; fixed_window 40/min versus the others",
     kLoginStorm},
    {"boundary-burst", "a client across a window boundary: 2x for fixed_window, 1x for sliding_log",
     kBoundaryBurst},
    {"retry-wave", "identical Retry-After versus jittered versus client backoff", kRetryWave},
    {"fleet", "6 instances x local 100/min versus one shared 300/min", kFleet},
}};

}  // namespace

std::span<const BuiltinScenario> BuiltinScenarios() { return kBuiltins; }

absl::StatusOr<Scenario> LoadBuiltin(std::string_view name) {
  std::string names;
  for (const BuiltinScenario& b : kBuiltins) {
    if (b.name == name)
      return ParseScenario(b.yaml, internal::Cat("builtin:", b.name), std::string(b.name));
    names += internal::Cat(names.empty() ? "" : ", ", b.name);
  }
  return absl::NotFoundError(internal::Cat("no built-in scenario \"", name, "\" (", names, ")"));
}

}  // namespace sluice::sim
