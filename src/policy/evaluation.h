// Evaluate: the one place where the policies that apply to a request decide
// it together. The decision API, auth_request, the gateway, the Envoy rate
// limit service and replay all call it; none decides anything itself.
//
// The rules, in the order they apply:
//   - A policy whose key part is missing (on_missing_key: deny) denies the
//     request before anything is taken; a shadow one only counts.
//   - All or nothing: a request that some enforced policy denies takes
//     nothing from any policy. What earlier policies took is given back;
//     later ones are only asked (taking nothing), so that every answer still
//     reports its limit.
//   - Policies with a shaping limit (leaky_bucket shape) decide last: a
//     departure slot is not given back. With two or more of them, each is
//     first asked, taking nothing, and the slots are taken only if all admit.
//   - In-process policies decide one after the other, at once; policies in a
//     remote store (Redis) decide together, one round trip for all of them.
//   - Shadow policies decide and count like the others and never deny.
//   - The verdict carries what the client is told: the answers behind the
//     RateLimit fields, Retry-After (the longest wait among enforced
//     denials, with the denying limit's jitter; none when some denial can
//     never pass), the status and the problem detail.
//
// Thread-safety: Evaluate may be called from any thread. `done` runs once:
// before Evaluate returns when every policy is in process (InProcess),
// otherwise on the remote store's thread.
#ifndef SLUICE_POLICY_EVALUATION_H_
#define SLUICE_POLICY_EVALUATION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "policy/headers.h"
#include "policy/policy_set.h"
#include "sluice/limiter.h"
#include "sluice/time.h"

namespace sluice::policy {

// One policy that applies to a request, with the key and cost it decides.
struct Applied {
  const Policy* policy = nullptr;
  std::optional<std::string> key;  // nullopt: a key part is missing (on_missing_key: deny)
  int64_t cost = 1;
};

// What one applied policy answered.
struct Answer {
  bool decided = false;   // false: its key was missing, or an error stopped the evaluation
  absl::Status error;     // this policy's decision failed (Verdict::error is the first such)
  bool took = false;      // it took its cost (and still holds it unless `refunded`)
  bool refunded = false;  // what it took was given back: the request was denied
  // When decided. After a refund, `remaining` is what was left before the
  // request, since nothing of it stayed taken.
  PolicyDecision decision;
};

struct Verdict {
  bool allowed = true;
  // A decision failed (a key the policy refuses, a store failure that
  // on_store_error does not cover): nothing stays taken, and the request
  // is answered as malformed (400, INVALID_ARGUMENT, ...).
  absl::Status error;
  std::vector<Answer> answers;  // one per Applied, in the same order
  // Policies that denied: enforced (by name, in decision order), and shadow.
  std::vector<std::string> violated;
  std::vector<std::string> shadow_denied;
  int status = 429;                      // the first enforced denial's on_deny.status
  Duration delay;                        // the longest shaping delay among admissions
  Duration retry_after;                  // the longest wait among enforced denials
  Duration jitter;                       // the jitter of the limit that set retry_after
  bool never = false;                    // some enforced denial can never pass
  std::string detail;                    // the problem document's detail of a denial
  absl::InlinedVector<size_t, 4> order;  // the decided answers' indexes, in decision order

  // The RateLimit fields of the enforced answers (legacy X-RateLimit-* too
  // when `legacy`), and Retry-After when denied and not `never`.
  void AppendHeaders(const std::vector<Applied>& applied, bool legacy, std::mt19937_64& rng,
                     FieldList& out) const;
};

using VerdictCallback = std::function<void(Verdict)>;

// Decides `applied` at `now` (see the rules above) and calls `done` once.
// `applied` must stay alive, with its policies, until `done` has run.
void Evaluate(const std::vector<Applied>& applied, Time now, VerdictCallback done);

// Gives back the slots an admitted request holds in concurrency limits
// (Limiter::Release), once it is done (its response complete): call it
// once per verdict, with the `applied` it was decided on, at `now`; the
// hold it ends feeds the policy's hold estimate (Policy::HoldEstimate)
// unless `observe_hold` is false (a front end that gives a slot back at
// once, holding none).
// Nothing for a verdict that holds nothing.
void Release(const std::vector<Applied>& applied, const Verdict& verdict, Time now,
             bool observe_hold = true);
// A request that waits out a shaping delay holds no concurrency slot
// meanwhile: Release gives its slots back before the wait, and Reacquire
// takes them again after it, at `now`, policy by policy, all or nothing.
// `done(true)`: held again, the answers carry the new holds (for Release).
// `done(false)`: a slot was not free (or its store failed); what was taken
// again is given back, and `verdict` is now that policy's denial (status,
// Retry-After, detail, violated) to answer. A shadow policy never denies:
// its slot is then simply not held. `applied` and `verdict` must stay alive
// until `done` has run (on a remote store's thread, or before returning).
void Reacquire(const std::vector<Applied>& applied, Verdict& verdict, Time now,
               std::function<void(bool)> done);
// Settles the cost of the admitted requests' policies whose `cost.settle`
// names a header of the upstream's answer (docs/settled-costs.md):
// `answer_header(name)` is that header's value, if any. A value that is
// not a whole number from 0 to 2^40 (or none) settles nothing: the
// estimate stays the cost. Returns how many policies were settled.
int SettleCosts(
    const std::vector<Applied>& applied, const Verdict& verdict,
    const std::function<std::optional<std::string_view>(std::string_view)>& answer_header);
// Whether the verdict holds concurrency slots that Release gives back.
bool Holds(const std::vector<Applied>& applied, const Verdict& verdict);
// Renews the leases of the slots the verdict holds, at `now`, without
// waiting (a request held long after its admission: a WebSocket's tunnel,
// a body streamed): `renewed(i, decision)` gets each policy's renewed
// decision, which Release and the next Renew must then use (a remote
// store's arrives on its thread), or the store's error when it could not
// renew (the slot is still held until its lease runs out: try again
// sooner). A slot already lost stays lost, and is not reported.
void Renew(const std::vector<Applied>& applied, const Verdict& verdict, Time now,
           const std::function<void(size_t, const absl::StatusOr<PolicyDecision>&)>& renewed);
// The shortest lease_ttl of the concurrency limits whose slots the verdict
// holds (Duration::Infinite() when none).
Duration ShortestLease(const std::vector<Applied>& applied, const Verdict& verdict);

// Whether Evaluate answers before it returns: every policy is in process.
bool InProcess(const std::vector<Applied>& applied);
// Evaluate, for policies that are all InProcess: the verdict, returned.
Verdict EvaluateNow(const std::vector<Applied>& applied, Time now);

// The answers of the enforced policies, as the RateLimit fields show them;
// their names are the policies' own (alive while `applied` is).
using PolicyAnswers = absl::InlinedVector<PolicyAnswer, 2>;
PolicyAnswers EnforcedAnswers(const std::vector<Applied>& applied, const Verdict& verdict);

}  // namespace sluice::policy

#endif  // SLUICE_POLICY_EVALUATION_H_
