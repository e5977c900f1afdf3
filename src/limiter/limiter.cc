#include "sluice/limiter.h"

#include <openssl/sha.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <random>

#include "base/cat.h"

namespace sluice {

using internal::Cat;

absl::StatusOr<std::string_view> Limiter::FitKey(std::string_view key, std::string& storage) const {
  if (key.size() <= kMaxKeyLength) return key;
  if (long_keys_ == LongKeys::kRefuse) return ValidateKey(key);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  storage = "sha256:";
  for (unsigned char b : digest) {
    storage.push_back(kHex[b >> 4]);
    storage.push_back(kHex[b & 15]);
  }
  return std::string_view(storage);
}

// Every public entry point fits its key first (see LongKeys); `fail` turns
// the error into that entry point's answer.
// (A key within the limit, nearly every one, costs one comparison.)
#define SLUICE_FIT_KEY(key, fail)                                                     \
  std::string fitted_storage_;                                                        \
  if (key.size() <= kMaxKeyLength) {                                                  \
  } else if (absl::StatusOr<std::string_view> fitted_ = FitKey(key, fitted_storage_); \
             !fitted_.ok()) {                                                         \
    return fail(fitted_.status());                                                    \
  } else {                                                                            \
    key = *fitted_;                                                                   \
  }

absl::StatusOr<std::unique_ptr<Limiter>> Limiter::Create(Store& store, LimiterOptions options) {
  std::unique_ptr<Limiter> limiter(new Limiter());
  limiter->name_ = options.name;
  limiter->clock_ = options.clock != nullptr ? options.clock : &SystemClock::Default();
  limiter->on_store_error_ = options.on_store_error;
  limiter->long_keys_ = options.long_keys;
  if (options.limits.empty()) {
    return absl::InvalidArgumentError(Cat("policy \"", options.name, "\": no limits"));
  }
  size_t shape_limits = 0;
  for (size_t i = 0; i < options.limits.size(); ++i) {
    absl::StatusOr<LimitConfig> config = MakeLimit(options.limits[i]);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          Cat("policy \"", options.name, "\" limit ", i + 1, ": ", config.status().message()));
    }
    if (IsShape(*config)) ++shape_limits;
    Store& where =
        i < options.stores.size() && options.stores[i] != nullptr ? *options.stores[i] : store;
    limiter->is_remote_.push_back(where.remote());
    if (where.remote()) {
      if (limiter->remote_ != nullptr && limiter->remote_ != &where) {
        return absl::InvalidArgumentError(
            Cat("policy \"", options.name, "\": limits in more than one remote store"));
      }
      limiter->remote_ = &where;
    }
    const bool leased = i < options.leases.size() && options.leases[i].has_value();
    absl::StatusOr<std::shared_ptr<LimitTable>> table =
        leased ? where.OpenLeasedTable(*config, options.name, *options.leases[i])
               : where.OpenNamedTable(*config, options.name);
    if (!table.ok()) {
      return absl::Status(table.status().code(), Cat("policy \"", options.name, "\" limit ", i + 1,
                                                     ": ", table.status().message()));
    }
    std::shared_ptr<LimitTable> fallback;
    if (where.remote() && options.on_store_error == OnStoreError::kLocal) {
      if (store.remote()) {
        return absl::InvalidArgumentError(
            Cat("policy \"", options.name, "\": on_store_error local needs an in-process store"));
      }
      absl::StatusOr<std::shared_ptr<LimitTable>> local = store.OpenTable(*config);
      if (!local.ok()) return local.status();
      fallback = *std::move(local);
    }
    limiter->holds_ = limiter->holds_ || IsConcurrency(*config);
    limiter->holds_here_ = limiter->holds_here_ || (IsConcurrency(*config) && !where.remote());
    limiter->configs_.push_back(*std::move(config));
    limiter->tables_.push_back(*std::move(table));
    limiter->fallback_.push_back(std::move(fallback));
  }
  if (shape_limits > 1) {
    return absl::InvalidArgumentError(
        Cat("policy \"", options.name, "\": at most one leaky_bucket shape limit per policy"));
  }
  for (size_t i = 0; i < limiter->configs_.size(); ++i) {
    if (!IsShape(limiter->configs_[i])) limiter->order_.push_back(i);
  }
  for (size_t i = 0; i < limiter->configs_.size(); ++i) {
    if (IsShape(limiter->configs_[i])) limiter->order_.push_back(i);
  }
  size_t remote_limits = 0, leased_limits = 0;
  for (size_t i = 0; i < limiter->configs_.size(); ++i) {
    if (!limiter->is_remote_[i]) continue;
    ++remote_limits;
    if (i < options.leases.size() && options.leases[i].has_value()) ++leased_limits;
  }
  if (leased_limits > 0 && remote_limits > 1) {
    // A leased limit is decided on this process' slice, the others in one
    // call: all-or-nothing across them would need the slice in that call.
    return absl::InvalidArgumentError(
        Cat("policy \"", options.name,
            "\": a leased limit must be the policy's only limit in the shared store"));
  }
  if (limiter->remote_ != nullptr) {
    for (size_t i : limiter->order_) {
      if (limiter->is_remote_[i]) {
        limiter->remote_limits_.push_back(i);
        limiter->remote_tables_.push_back(limiter->tables_[i].get());
        if (IsConcurrency(limiter->configs_[i]))
          limiter->remote_held_.push_back(limiter->tables_[i].get());
      } else if (IsShape(limiter->configs_[i])) {
        limiter->local_shape_ = i;
      } else {
        limiter->local_first_.push_back(i);
      }
    }
  }
  return limiter;
}

absl::StatusOr<PolicyDecision> Limiter::Acquire(std::string_view key, AcquireOptions options) {
  return AcquireAt(key, clock_->Now(), options.cost);
}

namespace {

// Among allowed decisions the one with the least remaining is the most
// restrictive; the largest delay wins over both.
void MergeAllowed(PolicyDecision& into, const Decision& d, size_t index, bool first) {
  const Duration delay = std::max(into.delay, d.delay);
  if (first || d.remaining < into.remaining) {
    static_cast<Decision&>(into) = d;
    into.limit_index = index;
  }
  into.delay = delay;
}

// A name for the slots one decision holds (PolicyDecision::slot): random,
// never 0. Names only tell a key's entries apart (a lease token carries its
// name signed), so they need not be secret: a per-thread generator seeded
// from the system's entropy.
uint64_t NewSlot() {
  thread_local uint64_t state = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device();
  }();
  for (;;) {  // splitmix64
    state += 0x9e3779b97f4a7c15;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    z ^= z >> 31;
    if (z != 0) return z;
  }
}

// What a limit answers for a key never seen: the answer `on_store_error:
// allow` reports for a remote limit it could not ask.
Decision FreshDecision(const LimitConfig& config, Time now, int64_t cost) {
  return std::visit(
      [&](const auto& c) -> Decision {
        StateOf_t<std::decay_t<decltype(c)>> state{};
        return DecideInPlace(c, state, now, cost);
      },
      config);
}

// Waits for an asynchronous answer (the blocking forms over a remote store).
template <typename T>
T Wait(const std::function<void(std::function<void(T)>)>& start) {
  std::promise<T> promise;
  std::future<T> future = promise.get_future();
  start([&promise](T value) { promise.set_value(std::move(value)); });
  return future.get();
}

}  // namespace

absl::StatusOr<PolicyDecision> Limiter::AcquireAt(std::string_view key, Time now, int64_t cost) {
  SLUICE_FIT_KEY(key, absl::StatusOr<PolicyDecision>)
  if (cost < 0) {
    return absl::InvalidArgumentError(Cat("cost must not be negative, got ", cost));
  }
  if (remote_ != nullptr) {
    return Wait<absl::StatusOr<PolicyDecision>>(
        [&](DecisionCallback done) { AcquireAsync(key, now, cost, std::move(done)); });
  }
  PolicyDecision result;
  result.taken_at = result.store_time = now;
  const uint64_t slot = holds_ ? NewSlot() : 0;
  for (size_t n = 0; n < order_.size(); ++n) {
    const size_t i = order_[n];
    absl::StatusOr<Decision> d =
        slot != 0 ? tables_[i]->Hold(key, now, cost, slot) : tables_[i]->Decide(key, now, cost);
    if (!d.ok() || !d->allowed) {
      // Give back what the earlier limits took: all-or-nothing.
      for (size_t m = 0; m < n; ++m) {
        (void)tables_[order_[m]]->Refund(key, now, cost, slot);
      }
      if (!d.ok()) return d.status();
      static_cast<Decision&>(result) = *d;
      result.limit_index = i;
      // Later limits may make the request wait longer still; Retry-After
      // must cover them all, so ask them too, taking nothing.
      for (size_t m = n + 1; m < order_.size(); ++m) {
        absl::StatusOr<Decision> later = tables_[order_[m]]->Check(key, now, cost);
        if (later.ok() && !later->allowed && later->retry_after > result.retry_after) {
          static_cast<Decision&>(result) = *later;
          result.limit_index = order_[m];
        }
      }
      return result;
    }
    MergeAllowed(result, *d, i, n == 0);
  }
  result.slot = slot;
  return result;
}

// The reported decision from each limit's own (absent: not asked), merged
// as AcquireAt merges: the first denial in decision order, replaced by a
// later one that waits longer; when all allow, the least remaining.
PolicyDecision Limiter::Merge(const std::vector<std::optional<Decision>>& by_limit) const {
  PolicyDecision result;
  bool denied = false;
  bool first = true;
  for (size_t i : order_) {
    if (!by_limit[i]) continue;
    const Decision& d = *by_limit[i];
    if (!d.allowed) {
      if (!denied || d.retry_after > result.retry_after) {
        static_cast<Decision&>(result) = d;
        result.limit_index = i;
      }
      denied = true;
    } else if (!denied) {
      MergeAllowed(result, d, i, first);
      first = false;
    }
  }
  return result;
}

// One AcquireAsync or CheckAsync over a remote store, between its steps.
namespace internal {

// A remote kDecide call that timed out: the store answered the request
// without it (on_store_error), but the call may still run in Redis. Its late
// reply says whether it took. If it did, what it took is given back when the
// request was not admitted (denied by the fallback, by another limit, or
// refunded later by the caller), and a `local` fallback that admitted the
// request gives back its own count of it, which Redis now holds. Lives
// without the Limiter (a reload may free it before the reply comes).
struct LateCall {
  Store* store = nullptr;
  std::vector<std::shared_ptr<LimitTable>> remote;    // in the call's order
  std::vector<std::shared_ptr<LimitTable>> fallback;  // those that took, else empty
  std::string key;
  Time now;
  int64_t cost = 0;
  uint64_t slot = 0;
  bool admitted = false;  // set before anyone else sees this

  std::mutex mu;
  bool refunded = false;  // the caller gave the request back
  bool answered = false;  // the late reply came
  bool took = false;      // and Redis took the cost
  bool fallback_given_back = false;
  Time store_time;

  void OnReply(const absl::StatusOr<BatchResult>& r) {
    if (!r.ok() || r->decisions.size() != remote.size()) return;
    bool all = true;
    for (const Decision& d : r->decisions) all = all && d.allowed;
    std::unique_lock lock(mu);
    answered = true;
    took = all;
    store_time = r->store_time;
    if (!took) return;
    if (!admitted || refunded) {
      lock.unlock();
      return GiveBackRemote();
    }
    if (fallback.empty() || fallback_given_back) return;
    fallback_given_back = true;
    lock.unlock();
    for (const auto& t : fallback) (void)t->Refund(key, now, cost, slot);
  }

  void OnRefund() {
    std::unique_lock lock(mu);
    refunded = true;
    const bool give_fallback = !fallback.empty() && !fallback_given_back;
    fallback_given_back = true;
    const bool give_remote = answered && took;
    lock.unlock();
    if (give_fallback) {
      for (const auto& t : fallback) (void)t->Refund(key, now, cost, slot);
    }
    if (give_remote) GiveBackRemote();
  }

  void GiveBackRemote() {
    std::vector<LimitTable*> tables;
    for (const auto& t : remote) tables.push_back(t.get());
    store->DecideBatch(tables, key, BatchOp::kRefund, now, cost, store_time, slot,
                       [](absl::StatusOr<BatchResult>) {});
  }
};

}  // namespace internal

struct Limiter::Pending {
  std::string key;
  Time now;
  int64_t cost = 0;
  uint64_t slot = 0;  // AcquireAsync of a limiter that holds slots
  bool take = true;   // AcquireAsync; false: CheckAsync
  std::vector<std::optional<Decision>> by_limit;
  std::vector<size_t> taken;  // local limits that took `cost`
  DecisionCallback done;
  std::shared_ptr<internal::LateCall> late;  // the call timed out
};

void Limiter::AcquireAsync(std::string_view key, Time now, int64_t cost, DecisionCallback done) {
  SLUICE_FIT_KEY(key, done)
  if (remote_ == nullptr) return done(AcquireAt(key, now, cost));
  if (cost < 0) {
    return done(absl::InvalidArgumentError(Cat("cost must not be negative, got ", cost)));
  }
  auto p = std::make_shared<Pending>();
  p->key = std::string(key);
  p->now = now;
  p->cost = cost;
  p->slot = holds_ ? NewSlot() : 0;
  p->by_limit.resize(configs_.size());
  p->done = std::move(done);
  // Local limits first: a request they deny never costs a round trip.
  for (size_t i : local_first_) {
    absl::StatusOr<Decision> d = p->slot != 0 ? tables_[i]->Hold(key, now, cost, p->slot)
                                              : tables_[i]->Decide(key, now, cost);
    if (!d.ok() || !d->allowed) {
      for (size_t t : p->taken) (void)tables_[t]->Refund(key, now, cost, p->slot);
      if (!d.ok()) return p->done(d.status());
      p->by_limit[i] = *d;
      for (size_t j : local_first_) {
        if (p->by_limit[j]) continue;
        absl::StatusOr<Decision> later = tables_[j]->Check(key, now, cost);
        if (later.ok()) p->by_limit[j] = *later;
      }
      PolicyDecision result = Merge(p->by_limit);
      result.taken_at = result.store_time = now;
      return p->done(std::move(result));
    }
    p->by_limit[i] = *d;
    p->taken.push_back(i);
  }
  remote_->DecideBatch(
      remote_tables_, p->key, BatchOp::kDecide, now, cost, Time(), p->slot,
      [this, p](absl::StatusOr<BatchResult> r) { Continue(p, std::move(r)); },
      [p](absl::StatusOr<BatchResult> r) {
        if (p->late) p->late->OnReply(r);
      });
}

void Limiter::CheckAsync(std::string_view key, Time now, int64_t cost, DecisionCallback done) {
  SLUICE_FIT_KEY(key, done)
  if (cost < 0) {
    return done(absl::InvalidArgumentError(Cat("cost must not be negative, got ", cost)));
  }
  if (remote_ == nullptr) {
    std::vector<std::optional<Decision>> by_limit(configs_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
      absl::StatusOr<Decision> d = tables_[i]->Check(key, now, cost);
      if (!d.ok()) return done(d.status());
      by_limit[i] = *d;
    }
    PolicyDecision result = Merge(by_limit);
    result.taken_at = result.store_time = now;
    return done(std::move(result));
  }
  auto p = std::make_shared<Pending>();
  p->key = std::string(key);
  p->now = now;
  p->cost = cost;
  p->take = false;
  p->by_limit.resize(configs_.size());
  p->done = std::move(done);
  for (size_t i : local_first_) {
    absl::StatusOr<Decision> d = tables_[i]->Check(key, now, cost);
    if (!d.ok()) return p->done(d.status());
    p->by_limit[i] = *d;
  }
  remote_->DecideBatch(remote_tables_, p->key, BatchOp::kCheck, now, cost, Time(), 0,
                       [this, p](absl::StatusOr<BatchResult> r) { Continue(p, std::move(r)); });
}

void Limiter::Continue(std::shared_ptr<Pending> p, absl::StatusOr<BatchResult> remote) {
  const std::string& key = p->key;
  Time store_time = p->now;
  bool store_error = false;
  bool remote_took = false;
  bool fallback_took = false;
  if (remote.ok() && remote->decisions.size() == remote_limits_.size()) {
    store_time = remote->store_time;
    bool all = true;
    for (size_t n = 0; n < remote_limits_.size(); ++n) {
      p->by_limit[remote_limits_[n]] = remote->decisions[n];
      all = all && remote->decisions[n].allowed;
    }
    remote_took = p->take && all;
  } else {
    store_error = true;
    if (p->take && absl::IsDeadlineExceeded(remote.status())) {
      // The call may still run in Redis: its late reply is reconciled.
      p->late = std::make_shared<internal::LateCall>();
      p->late->store = remote_;
      for (size_t i : remote_limits_) p->late->remote.push_back(tables_[i]);
      p->late->key = key;
      p->late->now = p->now;
      p->late->cost = p->cost;
      p->late->slot = p->slot;
    }
    switch (on_store_error_) {
      // A cost above what a limit can ever admit is denied as never passing
      // by every mode: no store failure makes it fit.
      case OnStoreError::kAllow:
        for (size_t i : remote_limits_) {
          Decision d = FreshDecision(configs_[i], p->now, p->cost);
          if (!d.can_never_pass()) {
            d.allowed = true;
            d.retry_after = Duration::Zero();
          }
          p->by_limit[i] = d;
        }
        break;
      case OnStoreError::kDeny:
        for (size_t i : remote_limits_) {
          Decision d = FreshDecision(configs_[i], p->now, p->cost);
          if (!d.can_never_pass()) {
            d.allowed = false;
            d.remaining = 0;
            d.delay = Duration::Zero();
            d.retry_after = Duration::Seconds(1);
          }
          p->by_limit[i] = d;
        }
        break;
      case OnStoreError::kLocal: {
        std::vector<LimitTable*> tables;
        for (size_t i : remote_limits_) tables.push_back(fallback_[i].get());
        absl::StatusOr<BatchResult> local =
            DecideInProcess(tables, key, p->take ? BatchOp::kDecide : BatchOp::kCheck, p->now,
                            p->cost, Time(), p->slot);
        if (!local.ok()) {
          for (size_t t : p->taken) (void)tables_[t]->Refund(key, p->now, p->cost, p->slot);
          return p->done(local.status());
        }
        bool all = true;
        for (size_t n = 0; n < remote_limits_.size(); ++n) {
          p->by_limit[remote_limits_[n]] = local->decisions[n];
          all = all && local->decisions[n].allowed;
        }
        fallback_took = p->take && all;
        break;
      }
    }
  }
  bool allowed = true;
  for (size_t i : remote_limits_) allowed = allowed && p->by_limit[i]->allowed;
  if (local_shape_) {
    const size_t i = *local_shape_;
    absl::StatusOr<Decision> d = !allowed || !p->take ? tables_[i]->Check(key, p->now, p->cost)
                                                      : tables_[i]->Decide(key, p->now, p->cost);
    if (d.ok()) p->by_limit[i] = *d;
    allowed = allowed && d.ok() && d->allowed;
    if (!d.ok()) {
      allowed = false;
      p->by_limit[i].reset();
    }
  }
  if (!allowed && p->take) {
    // All-or-nothing: give back what this request took so far.
    for (size_t t : p->taken) (void)tables_[t]->Refund(key, p->now, p->cost, p->slot);
    if (remote_took) {
      remote_->DecideBatch(remote_tables_, key, BatchOp::kRefund, p->now, p->cost, store_time,
                           p->slot, [](absl::StatusOr<BatchResult>) {});
    }
    if (fallback_took) {
      for (size_t i : remote_limits_) (void)fallback_[i]->Refund(key, p->now, p->cost, p->slot);
    }
  }
  PolicyDecision result = Merge(p->by_limit);
  result.taken_at = p->now;
  result.store_time = store_time;
  result.store_error = store_error;
  result.slot = p->slot;
  if (p->late) {
    p->late->admitted = allowed;
    if (allowed && fallback_took) {
      for (size_t i : remote_limits_) p->late->fallback.push_back(fallback_[i]);
    }
    result.late = p->late;
  }
  // `p` lives on until the late reply or its connection's end: let go of
  // what `done` holds now.
  DecisionCallback done = std::move(p->done);
  done(std::move(result));
}

absl::Status Limiter::Refund(std::string_view key, const PolicyDecision& taken, int64_t cost) {
  SLUICE_FIT_KEY(key, absl::Status)
  absl::Status result;
  for (size_t i : order_) {
    if (IsShape(configs_[i]) || is_remote_[i]) {
      continue;
    }
    result.Update(tables_[i]->Refund(key, taken.taken_at, cost, taken.slot));
  }
  if (remote_ == nullptr) return result;
  if (taken.store_error) {
    // A timed-out call: the fallback's count and what Redis may have taken
    // are given back together, whichever comes first.
    if (taken.late != nullptr) {
      taken.late->OnRefund();
      return result;
    }
    if (on_store_error_ == OnStoreError::kLocal) {
      for (size_t i : remote_limits_) {
        if (!IsShape(configs_[i]))
          result.Update(fallback_[i]->Refund(key, taken.taken_at, cost, taken.slot));
      }
    }
    return result;
  }
  remote_->DecideBatch(remote_tables_, key, BatchOp::kRefund, taken.taken_at, cost,
                       taken.store_time, taken.slot, [](absl::StatusOr<BatchResult>) {});
  return result;
}

absl::Status Limiter::Release(std::string_view key, const PolicyDecision& taken, int64_t cost) {
  if (!holds_) return absl::OkStatus();
  SLUICE_FIT_KEY(key, absl::Status)
  absl::Status result;
  for (size_t i : order_) {
    if (IsConcurrency(configs_[i]) && !is_remote_[i])
      result.Update(tables_[i]->Refund(key, taken.taken_at, cost, taken.slot));
  }
  if (remote_held_.empty()) return result;
  if (taken.store_error) {
    // A timed-out call (taken.late) may hold a slot in the store or not:
    // either way it ends with its lease. A `local` fallback's slot is here.
    if (taken.late == nullptr && on_store_error_ == OnStoreError::kLocal) {
      for (size_t i : remote_limits_) {
        if (IsConcurrency(configs_[i]))
          result.Update(fallback_[i]->Refund(key, taken.taken_at, cost, taken.slot));
      }
    }
    return result;
  }
  remote_->DecideBatch(remote_held_, key, BatchOp::kRefund, taken.taken_at, cost, taken.store_time,
                       taken.slot, [](absl::StatusOr<BatchResult>) {});
  return result;
}

absl::Status Limiter::Settle(std::string_view key, const PolicyDecision& taken, int64_t estimate,
                             int64_t actual) {
  SLUICE_FIT_KEY(key, absl::Status)
  if (estimate < 0 || actual < 0) {
    return absl::InvalidArgumentError(
        Cat("policy \"", name_, "\": a settled cost and its estimate are not negative"));
  }
  const int64_t more = actual - estimate;
  if (more == 0) return absl::OkStatus();
  auto settles = [&](size_t i) { return !IsShape(configs_[i]) && !IsConcurrency(configs_[i]); };
  if (more > 0) {
    for (size_t i : order_) {
      if (settles(i) && !Charges(configs_[i])) {
        return absl::FailedPreconditionError(
            Cat("policy \"", name_, "\": limit ", i, " (", AlgorithmName(AlgorithmOf(configs_[i])),
                ") cannot carry debt; settled costs need token_bucket, gcra, fixed_window or "
                "sliding_window"));
      }
    }
  }
  const Time now = clock_->Now();
  absl::Status result;
  std::vector<LimitTable*> remote;
  for (size_t i : order_) {
    if (!settles(i)) continue;
    if (is_remote_[i]) {
      remote.push_back(tables_[i].get());
      continue;
    }
    result.Update(more < 0 ? tables_[i]->Refund(key, taken.taken_at, -more, 0)
                           : tables_[i]->Charge(key, now, more));
  }
  // The remote limits in one call, without waiting (as Refund); a request
  // the store did not decide (on_store_error) has nothing there to settle.
  if (!remote.empty() && !taken.store_error) {
    if (more < 0) {
      remote_->DecideBatch(remote, key, BatchOp::kRefund, taken.taken_at, -more, taken.store_time,
                           0, [](absl::StatusOr<BatchResult>) {});
    } else {
      remote_->DecideBatch(remote, key, BatchOp::kCharge, now, more, Time(), 0,
                           [](absl::StatusOr<BatchResult>) {});
    }
  }
  return result;
}

void Limiter::RenewAsync(std::string_view key, Time now, const PolicyDecision& taken, int64_t cost,
                         DecisionCallback done) {
  HoldAsync(key, now, &taken, cost, std::move(done));
}

void Limiter::AcquireSlotsAsync(std::string_view key, Time now, int64_t cost,
                                DecisionCallback done) {
  HoldAsync(key, now, nullptr, cost, std::move(done));
}

void Limiter::HoldAsync(std::string_view key, Time now, const PolicyDecision* taken, int64_t cost,
                        DecisionCallback done) {
  SLUICE_FIT_KEY(key, done)
  if (!holds_) {
    return done(absl::FailedPreconditionError(
        Cat("policy \"", name_, "\" has no concurrency limit: no slot to hold")));
  }
  std::vector<std::optional<Decision>> by_limit(configs_.size());
  std::vector<size_t> held;
  bool denied = false;
  // A renew keeps its slots' name; slots taken afresh get one.
  const uint64_t slot = taken != nullptr ? taken->slot : NewSlot();
  for (size_t i : order_) {
    if (!IsConcurrency(configs_[i]) || is_remote_[i]) continue;
    absl::StatusOr<Decision> d = denied ? tables_[i]->Check(key, now, cost)
                                 : taken != nullptr
                                     ? tables_[i]->Renew(key, taken->taken_at, now, cost, slot)
                                     : tables_[i]->Hold(key, now, cost, slot);
    if (!d.ok()) {
      for (size_t j : held) (void)tables_[j]->Refund(key, now, cost, slot);
      return done(d.status());
    }
    if (!denied && d->allowed) held.push_back(i);
    if (!d->allowed) denied = true;
    by_limit[i] = *d;
  }
  auto finish = [this, now, slot, by_limit = std::move(by_limit), held = std::move(held),
                 key = std::string(key), cost, done = std::move(done),
                 renewing = taken != nullptr](absl::StatusOr<BatchResult> remote) mutable {
    if (!remote.ok()) {
      // Slots taken afresh go back. A renewal's stay renewed: the lease
      // still holds them (what the store holds of it is as it was, for
      // all the caller knows), and its holder goes on and renews again.
      if (!renewing) {
        for (size_t j : held) (void)tables_[j]->Refund(key, now, cost, slot);
      }
      return done(remote.status());
    }
    size_t next = 0;
    for (size_t i : remote_limits_) {
      if (IsConcurrency(configs_[i]) && next < remote->decisions.size())
        by_limit[i] = remote->decisions[next++];
    }
    PolicyDecision d = Merge(by_limit);
    d.taken_at = now;
    d.store_time = remote->store_time;
    d.slot = slot;
    if (!d.allowed) {
      for (size_t j : held) (void)tables_[j]->Refund(key, now, cost, slot);
    }
    done(std::move(d));
  };
  if (remote_held_.empty() || denied) {
    if (denied && taken != nullptr && !remote_held_.empty() && !taken->store_error) {
      // The lease is lost as a whole: what the store holds of it goes too.
      remote_->DecideBatch(remote_held_, key, BatchOp::kRefund, taken->taken_at, cost,
                           taken->store_time, slot, [](absl::StatusOr<BatchResult>) {});
    }
    return finish(BatchResult{.store_time = now, .decisions = {}});
  }
  // Redis renews at its own clock: the slots it holds were taken at the
  // store time of `taken`.
  if (taken != nullptr) {
    remote_->DecideBatch(remote_held_, key, BatchOp::kRenew, now, cost, taken->store_time, slot,
                         std::move(finish));
  } else {
    remote_->DecideBatch(remote_held_, key, BatchOp::kDecide, now, cost, Time(), slot,
                         std::move(finish));
  }
}

absl::Status Limiter::Refund(std::string_view key, Time taken_at, int64_t cost) {
  SLUICE_FIT_KEY(key, absl::Status)
  if (remote_ != nullptr) {
    // Only the decision says whether the store took and at its clock.
    return absl::FailedPreconditionError(
        Cat("policy \"", name_,
            "\": limits in a remote store are refunded with the decision "
            "that took them: Refund(key, decision, cost)"));
  }
  // The decision form, of a decision that names no slots (they go back
  // counted); a departure slot is not given back.
  PolicyDecision taken;
  taken.taken_at = taken.store_time = taken_at;
  return Refund(key, taken, cost);
}

void Limiter::InspectAsync(std::string_view key, Time now, int64_t cost, InspectCallback done) {
  SLUICE_FIT_KEY(key, done)
  std::vector<Decision> out(configs_.size());
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (is_remote_[i]) {
      continue;
    }
    absl::StatusOr<Decision> d = tables_[i]->Check(key, now, cost);
    if (!d.ok()) return done(d.status());
    out[i] = *d;
  }
  if (remote_ == nullptr) return done(std::move(out));
  remote_->DecideBatch(
      remote_tables_, key, BatchOp::kCheck, now, cost, Time(), 0,
      [this, out = std::move(out), done = std::move(done)](absl::StatusOr<BatchResult> r) mutable {
        if (!r.ok()) return done(r.status());
        for (size_t n = 0; n < remote_limits_.size() && n < r->decisions.size(); ++n) {
          out[remote_limits_[n]] = r->decisions[n];
        }
        done(std::move(out));
      });
}

absl::StatusOr<std::vector<Decision>> Limiter::Inspect(std::string_view key, Time now,
                                                       int64_t cost) {
  return Wait<absl::StatusOr<std::vector<Decision>>>(
      [&](InspectCallback done) { InspectAsync(key, now, cost, std::move(done)); });
}

absl::StatusOr<PolicyDecision> Limiter::Check(std::string_view key, AcquireOptions options) {
  const Time now = clock_->Now();
  if (remote_ == nullptr) {
    absl::StatusOr<PolicyDecision> result;
    CheckAsync(key, now, options.cost,
               [&result](absl::StatusOr<PolicyDecision> d) { result = std::move(d); });
    return result;
  }
  return Wait<absl::StatusOr<PolicyDecision>>(
      [&](DecisionCallback done) { CheckAsync(key, now, options.cost, std::move(done)); });
}

}  // namespace sluice
