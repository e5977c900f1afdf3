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

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_OUTCOME_H_
