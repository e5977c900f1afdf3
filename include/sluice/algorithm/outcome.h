// sluice/algorithm/outcome.h: what a pure Decide returns.
#ifndef SLUICE_ALGORITHM_OUTCOME_H_
#define SLUICE_ALGORITHM_OUTCOME_H_

#include "sluice/decision.h"

namespace sluice {

// The state to store after the decision, and the decision. When the request
// is denied (or cost is 0) `state` equals the state passed in: denied requests
// consume nothing.
template <typename State>
struct Outcome {
  State state;
  Decision decision;
};

// Charge (token_bucket, gcra, fixed_window, sliding_window) takes a cost
// whether or not it fits: a settled cost above its estimate. What is over
// the limit is debt, which later requests repay at the limit's rate (they
// are denied until it is). A key's debt is at most kMaxDebtLimits times
// its limit (a bucket: its capacity, and 2^52 ticks in all; a window: and
// what 2^51 us, 71 years, of windows repay); a charge beyond is taken only
// up to there.
inline constexpr int64_t kMaxDebtLimits = 1024;

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_OUTCOME_H_
