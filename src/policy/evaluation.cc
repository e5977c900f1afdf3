#include "policy/evaluation.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <memory>

#include "base/cat.h"

namespace sluice::policy {
namespace {

using internal::Cat;

// The answer of a policy that admits nothing (an Envoy rule with
// requests_per_unit: 0): never passes, resets on its window's boundary.
// A cost of 0 only reads, and passes.
PolicyDecision Nothing(const Policy& policy, Time now, int64_t cost) {
  PolicyDecision d;
  const int64_t period_us = std::max<int64_t>(1, policy.Period(0).micros());
  d.allowed = cost == 0;
  d.retry_after = d.allowed ? Duration::Zero() : Duration::Infinite();
  d.reset_after =
      Duration::Micros(period_us - (now.unix_micros() % period_us + period_us) % period_us);
  return d;
}

// One evaluation in flight. Decisions are made in waves: each in-process
// policy alone (it answers at once), then every remote policy together,
// then the shaping policies (asked first when there are two or more). Each
// wave's answers (and errors) are written to their own slots; the thread that brings the
// last one reads them all and starts the next wave.
class Run {
 public:
  Run(const std::vector<Applied>& applied, Time now, VerdictCallback done)
      : applied_(applied), now_(now), done_(std::move(done)) {
    verdict_.answers.resize(applied.size());
  }

  void Start() {
    for (size_t i = 0; i < applied_.size(); ++i) {
      const Applied& a = applied_[i];
      if (a.key) continue;
      a.policy->Count(Policy::kMissingKey);
      if (a.policy->shadow() || !verdict_.allowed) continue;
      verdict_.allowed = false;
      verdict_.violated.push_back(a.policy->name());
      verdict_.status = a.policy->config().on_deny.status;
      verdict_.never = true;
      verdict_.detail = Cat("policy \"", a.policy->name(),
                            "\": the request lacks a key part (on_missing_key: deny)");
    }
    if (!verdict_.allowed) return Done();  // nothing is taken
    std::vector<size_t> remote;
    for (size_t i = 0; i < applied_.size(); ++i) {
      const Policy& p = *applied_[i].policy;
      if (p.shapes()) {
        shapes_.push_back(i);
      } else if (!p.in_process()) {
        remote.push_back(i);
      } else if (error_.ok()) {
        // Answers before Decide returns.
        Decide(i, allowed_, [this, i](absl::StatusOr<PolicyDecision> d, bool take) {
          Record(i, std::move(d), take);
        });
        Absorb(i);
      }
    }
    if (!error_.ok()) return Done();
    Wave(std::move(remote), allowed_, &Run::Shapes);
  }

  // Makes the evaluation own itself until Done (when it is on the heap).
  void Own(std::unique_ptr<Run> self) { owned_ = std::move(self); }

 private:
  using Next = void (Run::*)();

  // Asks the policy of applied_[i], taking its cost when `take`.
  template <typename Callback>
  void Decide(size_t i, bool take, Callback callback) {
    const Applied& a = applied_[i];
    const Policy& p = *a.policy;
    if (!p.has_limiter()) return callback(Nothing(p, now_, a.cost), take);
    if (take && p.limiter().in_process()) {
      return callback(p.limiter().AcquireAt(*a.key, now_, a.cost), take);  // no callback to wrap
    }
    auto done = [callback = std::move(callback), take](absl::StatusOr<PolicyDecision> d) mutable {
      callback(std::move(d), take);
    };
    if (take) {
      p.limiter().AcquireAsync(*a.key, now_, a.cost, std::move(done));
    } else {
      p.limiter().CheckAsync(*a.key, now_, a.cost, std::move(done));
    }
  }

  void Record(size_t i, absl::StatusOr<PolicyDecision> d, bool take) {
    Answer& answer = verdict_.answers[i];
    if (!d.ok()) {
      answer = Answer{};
      answer.error = std::move(d).status();
      return;
    }
    answer.decided = true;
    answer.took = take && d->allowed && applied_[i].policy->has_limiter();
    answer.decision = *std::move(d);
  }

  // Folds answer i into the running outcome (on the thread that owns it).
  void Absorb(size_t i) {
    if (!verdict_.answers[i].error.ok()) {
      if (error_.ok()) error_ = verdict_.answers[i].error;
      return;
    }
    if (std::find(order_.begin(), order_.end(), i) == order_.end()) order_.push_back(i);
    const Answer& answer = verdict_.answers[i];
    if (!answer.decision.allowed && !applied_[i].policy->shadow()) allowed_ = false;
  }

  // Decides `which` together, then calls `next`.
  void Wave(std::vector<size_t> which, bool take, Next next) {
    if (which.empty()) return (this->*next)();
    wave_ = std::move(which);
    pending_.store(wave_.size() + 1, std::memory_order_relaxed);
    next_ = next;
    for (size_t i : wave_) {
      Decide(i, take, [this, i](absl::StatusOr<PolicyDecision> d, bool took) {
        Record(i, std::move(d), took);
        Arrive();
      });
    }
    Arrive();  // the launcher's own hold
  }

  void Arrive() {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (size_t i : wave_) Absorb(i);
    (this->*next_)();
  }

  void Shapes() {
    if (!error_.ok()) return Done();
    const auto enforced = std::count_if(shapes_.begin(), shapes_.end(),
                                        [&](size_t i) { return !applied_[i].policy->shadow(); });
    if (allowed_ && enforced >= 2) return Wave(shapes_, /*take=*/false, &Run::AfterShapesAsked);
    Wave(shapes_, allowed_, &Run::Done);
  }

  // Every shaping policy was asked: take the slots only if all admit.
  void AfterShapesAsked() {
    if (!error_.ok() || !allowed_) return Done();
    Wave(shapes_, /*take=*/true, &Run::Done);
  }

  void Done() {
    // An evaluation on the heap lives until here (see Evaluate).
    const std::unique_ptr<Run> owned = std::move(owned_);
    Verdict& v = verdict_;
    v.error = error_;
    // All or nothing: a denied request keeps nothing.
    if (!allowed_ || !error_.ok()) {
      for (size_t i = 0; i < applied_.size(); ++i) {
        Answer& answer = v.answers[i];
        const Applied& a = applied_[i];
        if (!answer.took || a.cost <= 0) continue;
        (void)a.policy->limiter().Refund(*a.key, answer.decision, a.cost);
        answer.refunded = true;
        answer.decision.remaining =
            std::min(answer.decision.limit, answer.decision.remaining + a.cost);
      }
    }
    bool in_flight = false;  // the wait told is a concurrency limit's
    for (size_t i : order_) {
      const Applied& a = applied_[i];
      const Policy& p = *a.policy;
      PolicyDecision& d = v.answers[i].decision;
      if (!d.allowed && p.Concurrent(d.limit_index) && !d.can_never_pass()) {
        // The lease TTL bounds the wait; the hold estimate says when a slot
        // usually frees.
        d.retry_after = p.HoldCap(d.retry_after);
      }
      if (d.store_error) p.CountStoreError();
      if (d.allowed) {
        p.Count(d.delay > Duration::Zero() ? Policy::kDelayed : Policy::kAllowed);
        v.delay = std::max(v.delay, d.delay);
      } else if (p.shadow()) {
        p.Count(Policy::kShadowDenied);
        if (a.key) p.CountDenial(*a.key, now_);
        v.shadow_denied.push_back(p.name());
      } else {
        p.Count(Policy::kDenied);
        if (a.key) p.CountDenial(*a.key, now_);
        if (v.allowed) v.status = p.config().on_deny.status;
        v.allowed = false;
        v.violated.push_back(p.name());
        if (d.can_never_pass()) {
          v.never = true;
          v.detail = p.has_limiter() ? Cat("this request can never pass: a cost of ", a.cost,
                                           " exceeds what policy \"", p.name(), "\" can ever admit")
                                     : Cat("this request can never pass: policy \"", p.name(),
                                           "\" admits nothing");
        } else if (d.retry_after >= v.retry_after) {
          v.retry_after = d.retry_after;
          v.jitter = p.JitterFor(d.limit_index);
          in_flight = p.Concurrent(d.limit_index);
        }
      }
    }
    if (!v.allowed && v.detail.empty()) {
      v.detail = Cat(in_flight ? "too many requests in flight" : "rate limit exceeded",
                     "; retry after ", v.retry_after.CeilMillis(), " ms");
    }
    v.order = std::move(order_);
    if (done_ == nullptr) return;  // EvaluateNow takes the verdict from here
    VerdictCallback done = std::move(done_);
    done(std::move(verdict_));
  }

 public:
  Verdict& verdict() { return verdict_; }

 private:
  std::unique_ptr<Run> owned_;  // itself, when on the heap
  const std::vector<Applied>& applied_;
  const Time now_;
  VerdictCallback done_;
  Verdict verdict_;
  bool allowed_ = true;  // no enforced denial so far
  absl::Status error_;
  absl::InlinedVector<size_t, 4> order_;  // decided, in decision order
  std::vector<size_t> shapes_;            // applied policies with a shaping limit
  std::vector<size_t> wave_;
  Next next_ = nullptr;
  std::atomic<size_t> pending_{0};
};

}  // namespace

Verdict EvaluateNow(const std::vector<Applied>& applied, Time now) {
  // Every answer comes before Decide returns: the evaluation ends here.
  Run run(applied, now, nullptr);
  run.Start();
  return std::move(run.verdict());
}

void Evaluate(const std::vector<Applied>& applied, Time now, VerdictCallback done) {
  if (InProcess(applied)) return done(EvaluateNow(applied, now));
  // Ends on the thread of the last answer, which frees it (Run::Done).
  auto run = std::make_unique<Run>(applied, now, std::move(done));
  Run& r = *run;
  r.Own(std::move(run));
  r.Start();
}

bool InProcess(const std::vector<Applied>& applied) {
  return std::all_of(applied.begin(), applied.end(),
                     [](const Applied& a) { return a.policy->in_process(); });
}

namespace {
bool HoldsSlots(const Applied& a, const Answer& answer) {
  return answer.took && !answer.refunded && a.cost > 0 && a.policy->has_limiter() &&
         a.policy->limiter().holds();
}
}  // namespace

bool Holds(const std::vector<Applied>& applied, const Verdict& verdict) {
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    if (HoldsSlots(applied[i], verdict.answers[i])) return true;
  }
  return false;
}

void Renew(const std::vector<Applied>& applied, const Verdict& verdict, Time now,
           const std::function<void(size_t, const absl::StatusOr<PolicyDecision>&)>& renewed) {
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    const Applied& a = applied[i];
    if (!HoldsSlots(a, verdict.answers[i])) continue;
    a.policy->limiter().RenewAsync(*a.key, now, verdict.answers[i].decision, a.cost,
                                   [i, renewed](absl::StatusOr<PolicyDecision> d) {
                                     if (!d.ok() || d->allowed) renewed(i, d);
                                   });
  }
}

Duration ShortestLease(const std::vector<Applied>& applied, const Verdict& verdict) {
  Duration shortest = Duration::Infinite();
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    if (!HoldsSlots(applied[i], verdict.answers[i])) continue;
    for (const LimitConfig& limit : applied[i].policy->limiter().limits()) {
      if (const auto* c = std::get_if<ConcurrencyConfig>(&limit)) {
        shortest = std::min(shortest, c->lease_ttl());
      }
    }
  }
  return shortest;
}

void Release(const std::vector<Applied>& applied, const Verdict& verdict, Time now,
             bool observe_hold) {
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    const Applied& a = applied[i];
    const Answer& answer = verdict.answers[i];
    if (!HoldsSlots(a, answer)) continue;
    (void)a.policy->limiter().Release(*a.key, answer.decision, a.cost);
    if (observe_hold) a.policy->ObserveHold(now - answer.decision.taken_at);
  }
}

namespace {

// One Reacquire, between its steps (one policy at a time).
struct Retake {
  const std::vector<Applied>* applied = nullptr;
  Verdict* verdict = nullptr;
  Time now;
  std::function<void(bool)> done;
  std::vector<size_t> pending;  // the answers to hold again, in order
  size_t next = 0;
  std::vector<size_t> held;  // those held again so far
};

void RetakeNext(const std::shared_ptr<Retake>& r) {
  if (r->next == r->pending.size()) return r->done(true);
  const size_t i = r->pending[r->next++];
  const Applied& a = (*r->applied)[i];
  a.policy->limiter().AcquireSlotsAsync(
      *a.key, r->now, a.cost, [r, i](absl::StatusOr<PolicyDecision> d) {
        const Applied& a = (*r->applied)[i];
        const Policy& p = *a.policy;
        Verdict& v = *r->verdict;
        Answer& answer = v.answers[i];
        if (d.ok() && d->allowed) {
          answer.decision.taken_at = d->taken_at;
          answer.decision.store_time = d->store_time;
          answer.decision.slot = d->slot;
          answer.decision.store_error = false;
          answer.decision.late = nullptr;
          r->held.push_back(i);
          return RetakeNext(r);
        }
        if (p.shadow()) {  // a trial: counted, never enforced; holds nothing now
          answer.refunded = true;
          return RetakeNext(r);
        }
        for (size_t j : r->held) {
          const Applied& h = (*r->applied)[j];
          (void)h.policy->limiter().Release(*h.key, v.answers[j].decision, h.cost);
          v.answers[j].refunded = true;
        }
        answer.refunded = true;
        v.allowed = false;
        v.status = p.config().on_deny.status;
        v.violated = {p.name()};
        v.never = false;
        if (d.ok()) {
          answer.decision = *d;
          answer.decision.retry_after = p.HoldCap(d->retry_after);
          v.retry_after = answer.decision.retry_after;
          v.jitter = p.JitterFor(d->limit_index);
        } else {
          answer.decision.allowed = false;
          answer.decision.retry_after = Duration::Seconds(1);
          v.retry_after = Duration::Seconds(1);
          v.jitter = Duration::Zero();
        }
        v.detail = Cat("policy \"", p.name(),
                       "\": no concurrency slot was free once the shaping delay had passed");
        r->done(false);
      });
}

}  // namespace

int SettleCosts(
    const std::vector<Applied>& applied, const Verdict& verdict,
    const std::function<std::optional<std::string_view>(std::string_view)>& answer_header) {
  int settled = 0;
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    const Applied& a = applied[i];
    const Answer& answer = verdict.answers[i];
    const std::string& header = a.policy->config().cost.response_header;
    if (header.empty() || !answer.took || answer.refunded || !a.policy->has_limiter()) continue;
    const std::optional<std::string_view> value = answer_header(header);
    if (!value) continue;
    std::string_view text = *value;
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
    int64_t actual = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), actual);
    if (ec != std::errc() || end != text.data() + text.size() || actual < 0 || actual > kMaxLimit) {
      continue;
    }
    if (a.policy->limiter().Settle(*a.key, answer.decision, a.cost, actual).ok()) ++settled;
  }
  return settled;
}

void Reacquire(const std::vector<Applied>& applied, Verdict& verdict, Time now,
               std::function<void(bool)> done) {
  auto r = std::make_shared<Retake>();
  r->applied = &applied;
  r->verdict = &verdict;
  r->now = now;
  r->done = std::move(done);
  for (size_t i = 0; i < applied.size() && i < verdict.answers.size(); ++i) {
    if (HoldsSlots(applied[i], verdict.answers[i])) r->pending.push_back(i);
  }
  RetakeNext(r);
}

PolicyAnswers EnforcedAnswers(const std::vector<Applied>& applied, const Verdict& verdict) {
  PolicyAnswers out;
  out.reserve(verdict.order.size());
  for (size_t i : verdict.order) {
    const Policy& p = *applied[i].policy;
    if (p.shadow()) continue;  // a trial: clients are not told about it
    const PolicyDecision& d = verdict.answers[i].decision;
    out.push_back({.name = p.name(),
                   .sf_name = p.sf_name(),
                   .decision = d,
                   .window_seconds = p.WindowSeconds(d.limit_index),
                   .concurrent = p.Concurrent(d.limit_index)});
  }
  return out;
}

void Verdict::AppendHeaders(const std::vector<Applied>& applied, bool legacy, std::mt19937_64& rng,
                            FieldList& out) const {
  AppendRateLimitHeaders(EnforcedAnswers(applied, *this), legacy, out);
  if (!allowed && !never) out.Add("Retry-After", RetryAfterSeconds(retry_after, jitter, rng));
}

}  // namespace sluice::policy
