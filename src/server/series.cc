#include "server/series.h"

#include <algorithm>
#include <set>

namespace sluice::server {

void DecisionSeries::Sample(const policy::PolicySet& set, int64_t end_unix_ms) {
  std::lock_guard lock(mu_);
  std::set<std::string_view> live;
  for (const policy::Policy& p : set.policies()) {
    live.insert(p.name());
    auto [it, added] = tracks_.try_emplace(p.name());
    Track& t = it->second;
    for (size_t o = 0; o < kOutcomes.size(); ++o) {
      const int64_t now = p.Counted(kOutcomes[o]);
      // A policy new since the last sample: its counter may be older than
      // it (a name that was in force before); counted from here, except at
      // the first sample, which counts from the start.
      if (added && filled_ > 0) t.last[o] = now;
      t.counts[o][next_] = std::max<int64_t>(0, now - t.last[o]);
      t.last[o] = now;
    }
  }
  for (auto it = tracks_.begin(); it != tracks_.end();) {
    it = live.contains(it->first) ? std::next(it) : tracks_.erase(it);
  }
  next_ = (next_ + 1) % kSeconds;
  filled_ = std::min(filled_ + 1, kSeconds);
  end_unix_ms_ = end_unix_ms;
}

DecisionSeries::View DecisionSeries::Last(size_t seconds) const {
  std::lock_guard lock(mu_);
  View view;
  view.end_unix_ms = end_unix_ms_;
  const size_t n = std::min(seconds, filled_);
  for (const auto& [name, t] : tracks_) {
    std::array<std::vector<int64_t>, 4>& out = view.policies[name];
    for (size_t o = 0; o < kOutcomes.size(); ++o) {
      out[o].reserve(n);
      for (size_t i = 0; i < n; ++i) {
        out[o].push_back(t.counts[o][(next_ + kSeconds - n + i) % kSeconds]);
      }
    }
  }
  return view;
}

}  // namespace sluice::server
