// sluice/decision.h: the answer to "may this request pass now?".
//
// Over the limit is a value, not an error: a denial is a normal Decision.
// Everything a response needs is here; the server turns it into 429,
// Retry-After and RateLimit headers, the library user into whatever fits.
//
// Units: counts are in cost units, durations in microseconds (sluice::Duration).
//
//   sluice::Decision d = ...;
//   if (!d.allowed) reply_429(d.retry_after.CeilSeconds());
#ifndef SLUICE_DECISION_H_
#define SLUICE_DECISION_H_

#include <cstdint>

#include "sluice/time.h"

namespace sluice {

struct Decision {
  bool allowed = false;
  // The quota this decision is measured against: `burst` for the bucket
  // algorithms, `limit` per window for the window algorithms, the queue
  // length for leaky_bucket shape.
  int64_t limit = 0;
  // Cost units that could pass right now, after this decision. Below zero
  // by a debt: a charge past what was left (Charge, settled costs), or a
  // clock that stepped back behind what was taken (gcra, sliding_window);
  // at most kMaxDebtLimits limits below.
  int64_t remaining = 0;
  // Time until the key's state is back to fresh (a full bucket, empty
  // windows): after that, the key is as if never seen.
  Duration reset_after;
  // Earliest time from now at which the same request could pass. Zero when
  // allowed; Duration::Infinite() when it never can (cost above capacity).
  Duration retry_after;
  // leaky_bucket shape: how long to hold the request before forwarding it.
  // Zero for every other algorithm.
  Duration delay;

  bool can_never_pass() const { return !allowed && retry_after.IsInfinite(); }
};

}  // namespace sluice

#endif  // SLUICE_DECISION_H_
