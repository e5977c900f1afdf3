#include "sluice/store/redis_store.h"

#include <hiredis/hiredis.h>

#include <charconv>
#include <future>

#include "base/cat.h"
#include "redis/client.h"
#include "store/redis/script.h"

namespace sluice {

using internal::Cat;

namespace {

absl::StatusOr<redis::Endpoint> ParseEndpoint(std::string_view text, std::string_view what) {
  absl::StatusOr<RedisUrl> url = ParseRedisUrl(Cat("redis://", text));
  if (!url.ok()) {
    return absl::InvalidArgumentError(Cat(what, " \"", text, "\": ", url.status().message()));
  }
  if (!url->user.empty() || !url->password.empty() || url->database != 0) {
    return absl::InvalidArgumentError(Cat(what, " \"", text, "\": only host:port"));
  }
  return redis::Endpoint{url->host, url->port};
}

}  // namespace

// ---------------------------------------------------------------------------

namespace {

class RedisTable final : public LimitTable {
 public:
  RedisTable(RedisStore& store, const redis::Client& client, LimitConfig config, std::string name)
      : store_(store),
        client_(client),
        config_(std::move(config)),
        name_(std::move(name)),
        params_(redis::LimitParams(config_)) {
    // What makes two limits of one policy distinct, readable in redis-cli:
    // "gcra:100/1s:20" ("token_bucket:40/1s:40", "fixed_window:300/1m").
    const Rate& rate = RateOf(config_);
    suffix_ = Cat(":", AlgorithmName(AlgorithmOf(config_)), ":", rate.limit, "/",
                  FormatDuration(rate.period));
    std::visit(
        [&](const auto& c) {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_base_of_v<BucketConfig, C>) suffix_ += Cat(":", c.burst());
          if constexpr (std::is_same_v<C, LeakyShapeConfig>) {
            suffix_ += Cat(":shape:", FormatDuration(c.max_delay()), ":", c.queue());
          }
        },
        config_);
  }

  absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) override {
    return One(key, BatchOp::kDecide, now, cost, Time());
  }
  absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) override {
    return One(key, BatchOp::kCheck, now, cost, Time());
  }
  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost) override {
    return One(key, BatchOp::kRefund, taken_at, cost, taken_at).status();
  }
  const LimitConfig& config() const override { return config_; }

  const std::string& name() const { return name_; }
  const std::string& suffix() const { return suffix_; }
  const std::vector<std::string>& params() const { return params_; }

 private:
  absl::StatusOr<Decision> One(std::string_view key, BatchOp op, Time now, int64_t cost,
                               Time taken_at);

  RedisStore& store_;
  const redis::Client& client_;
  LimitConfig config_;
  std::string name_;
  std::string suffix_;
  std::vector<std::string> params_;
};

}  // namespace

struct RedisStore::Impl {
  RedisStoreOptions options;
  std::unique_ptr<redis::Client> client;
  std::string sha;
};

absl::StatusOr<std::unique_ptr<RedisStore>> RedisStore::Connect(RedisStoreOptions options,
                                                                EventLog log) {
  if (options.url.empty() == options.cluster.empty()) {
    return absl::InvalidArgumentError("redis: give exactly one of url and cluster");
  }
  if (options.key_prefix.find_first_of("{}") != std::string::npos) {
    return absl::InvalidArgumentError(
        Cat("redis key_prefix \"", options.key_prefix, "\": no '{' or '}' (they set hash tags)"));
  }
  if (options.timeout <= Duration::Zero() || options.connect_timeout <= Duration::Zero()) {
    return absl::InvalidArgumentError("redis: timeouts must be positive");
  }
  redis::ClientOptions client;
  if (!options.url.empty()) {
    absl::StatusOr<RedisUrl> url = ParseRedisUrl(options.url);
    if (!url.ok()) return url.status();
    client.nodes.push_back({url->host, url->port});
    client.user = url->user;
    client.password = url->password;
    client.database = url->database;
  } else {
    client.cluster = true;
    for (const std::string& node : options.cluster) {
      absl::StatusOr<redis::Endpoint> ep = ParseEndpoint(node, "redis cluster node");
      if (!ep.ok()) return ep.status();
      client.nodes.push_back(*ep);
    }
  }
  if (!options.user.empty()) client.user = options.user;
  if (!options.password.empty()) client.password = options.password;
  if (options.database != 0) client.database = options.database;
  client.timeout = options.timeout;
  client.connect_timeout = options.connect_timeout;
  client.scripts.push_back(std::string(redis::DecideScript()));
  client.log = std::move(log);
  absl::StatusOr<std::unique_ptr<redis::Client>> connected = redis::Client::Connect(client);
  if (!connected.ok()) return connected.status();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->client = *std::move(connected);
  impl->sha = impl->client->script_sha(0);
  if (impl->sha != redis::DecideScriptSha()) {
    return absl::InternalError(Cat("redis: SCRIPT LOAD answered SHA ", impl->sha, ", expected ",
                                   redis::DecideScriptSha()));
  }
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(impl)));
}

RedisStore::RedisStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The client stops while the whole store is alive: a callback answered by
// the stop may call the store again (it is answered Cancelled).
RedisStore::~RedisStore() { impl_->client->Stop(); }

const RedisStoreOptions& RedisStore::options() const { return impl_->options; }

absl::StatusOr<std::shared_ptr<LimitTable>> RedisStore::OpenTable(const LimitConfig& config) {
  return OpenNamedTable(config, "");
}

absl::StatusOr<std::shared_ptr<LimitTable>> RedisStore::OpenNamedTable(const LimitConfig& config,
                                                                       std::string_view name) {
  if (absl::Status s = redis::ValidateForRedis(config); !s.ok()) return s;
  return std::make_shared<RedisTable>(*this, *impl_->client, config, std::string(name));
}

std::string RedisStore::RedisKey(const LimitTable& table, std::string_view key) const {
  const auto& t = static_cast<const RedisTable&>(table);
  return Cat(impl_->options.key_prefix, "{", t.name(), ":", key, "}", t.suffix());
}

void RedisStore::DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op,
                             Time now, int64_t cost, Time taken_at, BatchCallback done,
                             BatchCallback late) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return done(s);
  if (tables.empty()) return done(BatchResult{.store_time = now, .decisions = {}});
  redis::ScriptArgs args{.op = op == BatchOp::kDecide  ? redis::ScriptOp::kDecide
                               : op == BatchOp::kCheck ? redis::ScriptOp::kCheck
                                                       : redis::ScriptOp::kRefund,
                         .cost = cost,
                         .taken_at = taken_at};
  if (impl_->options.use_caller_time) args.now = now;
  std::vector<std::string> keys;
  keys.reserve(tables.size());
  redis::ScriptCall call;
  call.Start(impl_->sha, args, tables.size());
  for (LimitTable* table : tables) {
    keys.push_back(RedisKey(*table, key));
    call.AddLimit(keys.back(), static_cast<RedisTable*>(table)->params());
  }
  const char** argv = call.argv();
  std::vector<std::string_view> parts;
  parts.reserve(static_cast<size_t>(call.argc()));
  for (int i = 0; i < call.argc(); ++i) parts.emplace_back(argv[i], call.argvlen()[i]);
  std::string command;
  redis::AppendCommand(command, parts.data(), parts.size());
  // A refund's reply holds Redis' time and no decision.
  const size_t decisions = op == BatchOp::kRefund ? 0 : tables.size();
  auto parse = [decisions](absl::StatusOr<redis::Reply> reply) -> absl::StatusOr<BatchResult> {
    if (!reply.ok()) return reply.status();
    absl::StatusOr<redis::ScriptResult> r = redis::ParseScriptReply(**reply, decisions);
    if (!r.ok()) return r.status();
    return BatchResult{.store_time = r->now, .decisions = std::move(r->decisions)};
  };
  redis::ReplyCallback late_reply;
  if (late) {
    late_reply = [parse, late = std::move(late)](absl::StatusOr<redis::Reply> reply) {
      late(parse(std::move(reply)));
    };
  }
  impl_->client->Send(
      redis::HashSlot(keys.front()), std::move(command),
      [parse, done = std::move(done)](absl::StatusOr<redis::Reply> reply) {
        done(parse(std::move(reply)));
      },
      std::move(late_reply));
}

RedisStoreHealth RedisStore::Health() const {
  const redis::ClientHealth h = impl_->client->Health();
  return {.up = h.all_slots_covered,
          .nodes = h.nodes,
          .nodes_up = h.nodes_up,
          .calls = h.requests,
          .errors = h.errors,
          .timeouts = h.timeouts,
          .late_replies = h.late_replies,
          .reconnects = h.reconnects,
          .redirects = h.redirects,
          .topology_refreshes = h.topology_refreshes};
}

namespace {

absl::StatusOr<Decision> RedisTable::One(std::string_view key, BatchOp op, Time now, int64_t cost,
                                         Time taken_at) {
  if (client_.OnIoThread()) {
    return absl::FailedPreconditionError(
        "redis: a blocking call on the store's own I/O thread would wait for itself");
  }
  std::promise<absl::StatusOr<BatchResult>> promise;
  std::future<absl::StatusOr<BatchResult>> future = promise.get_future();
  LimitTable* self = this;
  store_.DecideBatch(
      std::span<LimitTable* const>(&self, 1), key, op, now, cost, taken_at,
      [&promise](absl::StatusOr<BatchResult> r) { promise.set_value(std::move(r)); });
  absl::StatusOr<BatchResult> r = future.get();
  if (!r.ok()) return r.status();
  if (op == BatchOp::kRefund) return Decision{};
  if (r->decisions.size() != 1) return absl::InternalError("redis: wrong number of decisions");
  return r->decisions.front();
}

}  // namespace

}  // namespace sluice
