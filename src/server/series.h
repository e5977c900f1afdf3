// DecisionSeries: each policy's decisions per second over the last
// kSeconds, by outcome, for the admin listener's /v1/series (the dashboard's
// live charts). Sampled once a second from the policies' own counters
// (sluice_decisions_total), so the hot path pays nothing for it. Memory:
// kSeconds * 4 integers per policy in force.
//
// Thread-safety: all methods from any thread.
#ifndef SLUICE_SERVER_SERIES_H_
#define SLUICE_SERVER_SERIES_H_

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "policy/policy_set.h"

namespace sluice::server {

class DecisionSeries {
 public:
  static constexpr size_t kSeconds = 300;
  // The outcomes kept, in this order: allowed, delayed, denied, shadow_denied.
  static constexpr std::array<policy::Policy::Outcome, 4> kOutcomes = {
      policy::Policy::kAllowed, policy::Policy::kDelayed, policy::Policy::kDenied,
      policy::Policy::kShadowDenied};
  static constexpr std::array<const char*, 4> kOutcomeNames = {"allowed", "delayed", "denied",
                                                               "shadow_denied"};

  // Takes one sample: what each policy of `set` counted since the last one,
  // the second ending at `end_unix_ms`. Policies no longer in `set` are
  // dropped; a new one starts at zero.
  void Sample(const policy::PolicySet& set, int64_t end_unix_ms);

  struct View {
    int64_t end_unix_ms = 0;  // the end of the last sample's second
    // policy -> outcome (kOutcomes' order) -> counts, oldest first
    std::map<std::string, std::array<std::vector<int64_t>, 4>> policies;
  };
  // The last `seconds` samples (fewer right after start).
  View Last(size_t seconds) const;

 private:
  struct Track {
    std::array<std::array<int64_t, kSeconds>, 4> counts{};
    std::array<int64_t, 4> last{};  // the counters at the previous sample
  };
  mutable std::mutex mu_;
  std::map<std::string, Track> tracks_;
  size_t next_ = 0;    // the ring slot the next sample goes to
  size_t filled_ = 0;  // samples taken, up to kSeconds
  int64_t end_unix_ms_ = 0;
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SERIES_H_
