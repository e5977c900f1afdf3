// The YAML config loader: yaml-cpp builds the node tree, this file walks it
// against the schema in docs/configuration.md, with the reader every sluice
// file format shares (config/yaml_reader.h).
//
// Every error is "<source>:<line>: <path>: <message>", the first one found.
// Absent optional keys leave the default that the struct in sluice/config.h
// already holds, which is why the section readers below fill a reference
// instead of returning a value.
//
// One file, longer than the usual 300 lines, because it is one schema read
// top to bottom.
#include "sluice/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/ascii.h"
#include "base/cat.h"
#include "base/cpus.h"
#include "config/envoy_yaml.h"
#include "config/yaml_reader.h"
#include "config/yaml_text.h"
#include "sluice/rate.h"

namespace sluice {
namespace {

using internal::Cat;
using internal::DurationBounds;
using internal::kPositive;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr DurationBounds kTimeout = {.min = kPositive, .max = kMaxTimeout};
// A route's request body (routes[].max_body_bytes): 1 TiB, streamed.
constexpr int64_t kMaxRouteBodyBytes = int64_t{1} << 40;

using Value = internal::YamlAt;
using internal::DescribeNode;
using internal::JoinPath;

// RFC 9110 token characters: what header names and methods are made of.
bool IsToken(std::string_view s) {
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kExtra.find(c) != std::string_view::npos;
  });
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

class Parser : public internal::YamlReader {
 public:
  Parser(std::string source, ConfigLoadOptions options)
      : YamlReader(std::move(source)), options_(options) {}

  absl::StatusOr<Config> Run(std::string_view yaml);

 private:
  absl::StatusOr<HostPort> ReadHostPort(const Value& v) const;

  absl::Status ReadServer(const Value& v, ServerConfig& out) const;
  absl::Status ReadDecision(const Value& v, DecisionConfig& out) const;
  absl::Status ReadStore(const Value& v, StoreConfig& out) const;
  absl::Status ReadRedisTls(const Value& v, RedisTls& out) const;
  absl::Status ReadListenerTls(const Value& v, std::optional<ListenerTls>& out) const;
  absl::Status ReadEnvoyLimitHeaders(const Value& v, bool legacy_headers,
                                     std::optional<EnvoyLimitHeaders>& out) const;
  absl::StatusOr<std::string> ReadPemFile(const Value& v) const;
  absl::Status ReadRedisNodes(const Value& v, std::string_view example_port,
                              std::vector<std::string>& out) const;
  absl::Status ReadRedisSentinel(const Value& v, RedisSentinel& out) const;
  absl::StatusOr<std::string> ReadEnvironment(const Value& v) const;
  absl::Status ReadTrustedProxies(const Value& v, std::vector<Cidr>& out) const;
  absl::Status ReadClientIpPrefix(const Value& v, ClientIpPrefix& out) const;
  absl::Status ReadMatch(const Value& v, MatchConfig& out) const;
  absl::StatusOr<HostPort> ReadUpstream(const Value& v, bool& tls) const;
  // `server_body_bytes`: server.max_body_bytes, read before the routes.
  absl::Status ReadRoute(const Value& v, std::map<std::string, int>& names,
                         int64_t server_body_bytes, RouteConfig& out) const;
  absl::Status ReadKey(const Value& v, std::vector<KeyPart>& out) const;
  absl::StatusOr<LimitSpec> ReadLimit(const Value& v) const;
  absl::StatusOr<LeaseOptions> ReadLease(const Value& v) const;
  absl::Status ReadRlqs(const Value& v, RlqsConfig& out) const;
  absl::Status ReadRlqsLimit(const Fields& f, RlqsLimitConfig& out) const;
  absl::Status ReadDeny(const Value& v, DenyConfig& out) const;
  absl::Status ReadCost(const Value& v, PolicyConfig& out) const;
  absl::Status ReadPolicy(const Value& v, std::map<std::string, int>& names,
                          PolicyConfig& out) const;
  // Names are unique within their list; `names` maps each name seen to its line.
  absl::Status ReadUniqueName(const Value& v, std::string_view what,
                              std::map<std::string, int>& names, std::string& out) const;

  ConfigLoadOptions options_;
  bool shared_store_ = false;        // store.redis is configured: limits default to global
  ClientIpPrefix client_ip_prefix_;  // the top-level one: every policy's default
};

absl::StatusOr<HostPort> Parser::ReadHostPort(const Value& v) const {
  return ReadParsed(v, "HOST:PORT such as 127.0.0.1:8080", ParseHostPort);
}

absl::Status Parser::ReadServer(const Value& v, ServerConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(
      v, kMapOfKeys,
      {"listen", "admin", "threads", "max_connections", "max_header_bytes", "max_body_bytes",
       "read_timeout", "idle_timeout", "upstream_timeout", "drain_timeout", "access_log",
       "legacy_headers", "cpu_affinity", "underscores_in_headers", "decision", "tls"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("listen")) {
    SLUICE_ASSIGN_OR_RETURN(out.listen, ReadHostPort(*x));
  }
  if (const Value* x = f->Find("tls")) SLUICE_RETURN_IF_ERROR(ReadListenerTls(*x, out.tls));
  if (const Value* x = f->Find("admin")) {
    SLUICE_ASSIGN_OR_RETURN(out.admin, ReadHostPort(*x));
  }
  if (const Value* x = f->Find("threads")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t threads, ReadInt(*x, 0, 256));
    out.threads = static_cast<int>(threads);
  }
  if (const Value* x = f->Find("max_connections")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_connections, ReadInt(*x, 1, kInt64Max));
  }
  if (const Value* x = f->Find("max_header_bytes")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_header_bytes, ReadInt(*x, 1024, 1024 * 1024));
  }
  if (const Value* x = f->Find("max_body_bytes")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_body_bytes, ReadInt(*x, 0, 64 * 1024 * 1024));
  }
  const std::pair<std::string_view, Duration*> timeouts[] = {
      {"read_timeout", &out.read_timeout},
      {"idle_timeout", &out.idle_timeout},
      {"upstream_timeout", &out.upstream_timeout},
      {"drain_timeout", &out.drain_timeout},
  };
  for (const auto& [key, field] : timeouts) {
    if (const Value* x = f->Find(key)) {
      SLUICE_ASSIGN_OR_RETURN(*field, ReadDuration(*x, kTimeout));
    }
  }
  if (const Value* x = f->Find("decision")) SLUICE_RETURN_IF_ERROR(ReadDecision(*x, out.decision));
  if (const Value* x = f->Find("access_log")) {
    SLUICE_ASSIGN_OR_RETURN(out.access_log, ReadBool(*x));
  }
  if (const Value* x = f->Find("legacy_headers")) {
    SLUICE_ASSIGN_OR_RETURN(out.legacy_headers, ReadBool(*x));
  }
  if (const Value* x = f->Find("underscores_in_headers")) {
    SLUICE_ASSIGN_OR_RETURN(out.underscores_in_headers, ReadBool(*x));
  }
  if (const Value* x = f->Find("cpu_affinity")) {
    SLUICE_ASSIGN_OR_RETURN(out.cpu_affinity, ReadBool(*x));
  }
  // Port 0 asks the OS for a free port, so two zeros do not collide.
  if (out.listen == out.admin && out.listen.port != 0) {
    const bool admin_given = f->Find("admin") != nullptr;
    const Value* at = admin_given ? f->Find("admin") : f->Find("listen");
    if (at == nullptr) at = &f->self();  // cannot happen: the defaults differ
    const bool v6 = out.admin.host.find(':') != std::string::npos;
    return Fail(
        *at, Cat("same address as server.", admin_given ? "listen" : "admin", " (", v6 ? "[" : "",
                 out.admin.host, v6 ? "]" : "", ":", static_cast<int>(out.admin.port),
                 "); the admin listener needs an address of its own"));
  }
  if (const std::optional<HostPort>& d = out.decision.listen; d && d->port != 0) {
    if (*d == out.listen || *d == out.admin) {
      Value at = f->self();
      if (const Value* x = f->Find("decision")) at = *x;
      return Fail({at.node, JoinPath(at.path, "listen"), at.line},
                  Cat("same address as server.", *d == out.listen ? "listen" : "admin",
                      "; the decision API needs an address of its own"));
    }
  }
  return absl::OkStatus();
}

// A bearer token: visible ASCII without commas, long enough not to be guessed.
absl::Status CheckToken(std::string_view token) {
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
    return absl::InvalidArgumentError(Cat("a token must be ", kMinTokenLength, " to ",
                                          kMaxTokenLength, " characters long, got ", token.size()));
  }
  if (!std::all_of(token.begin(), token.end(),
                   [](char c) { return c > ' ' && c < 0x7f && c != ','; })) {
    return absl::InvalidArgumentError(
        "a token may hold only visible ASCII characters, no spaces or commas");
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadDecision(const Value& v, DecisionConfig& out) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys,
              {"listen", "on_gateway_listener", "tokens", "token_env", "lease_secret_env", "tls"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("listen")) {
    SLUICE_ASSIGN_OR_RETURN(out.listen, ReadHostPort(*x));
  }
  if (const Value* x = f->Find("tls")) {
    if (!out.listen) {
      return Fail(*x,
                  "TLS here is for decision.listen, which is not set (server.tls covers "
                  "server.listen)");
    }
    SLUICE_RETURN_IF_ERROR(ReadListenerTls(*x, out.tls));
  }
  if (const Value* x = f->Find("on_gateway_listener")) {
    SLUICE_ASSIGN_OR_RETURN(out.on_gateway_listener, ReadBool(*x));
    if (out.on_gateway_listener && out.listen) {
      return Fail(*x, "give listen (a listener of its own) or on_gateway_listener, not both");
    }
  }
  if (const Value* x = f->Find("tokens")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "tokens");
    if (!items.ok()) return items.status();
    for (const Value& item : *items) {
      absl::StatusOr<std::string> token = ReadScalar(item, "a token (a string)");
      if (!token.ok()) return token.status();
      if (absl::Status s = CheckToken(*token); !s.ok()) return Fail(item, s);
      out.tokens.push_back(*token);
    }
  }
  if (const Value* x = f->Find("token_env")) {
    absl::StatusOr<std::string> name = ReadScalar(*x, "an environment variable's name");
    if (!name.ok()) return name.status();
    const char* value = std::getenv(name->c_str());
    if (value == nullptr || *value == '\0') {
      return Fail(*x, Cat("the environment has no ", *name, " (or it is empty)"));
    }
    // One token, or several separated by commas or spaces (to rotate them).
    std::string_view rest = value;
    while (!rest.empty()) {
      const size_t end = rest.find_first_of(", \t\n");
      const std::string_view token = rest.substr(0, end);
      if (!token.empty()) {
        if (absl::Status s = CheckToken(token); !s.ok()) {
          return Fail(*x, Cat("in ", *name, ": ", s.message()));
        }
        out.tokens.emplace_back(token);
      }
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
  }
  if (const Value* x = f->Find("lease_secret_env")) {
    absl::StatusOr<std::string> name = ReadScalar(*x, "an environment variable's name");
    if (!name.ok()) return name.status();
    const char* value = std::getenv(name->c_str());
    if (value == nullptr || std::string_view(value).size() < kMinTokenLength) {
      return Fail(*x, Cat("the environment has no ", *name, " of at least ", kMinTokenLength,
                          " characters"));
    }
    out.lease_secret = value;
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadStore(const Value& v, StoreConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys, {"memory", "redis"});
  if (!f.ok()) return f.status();
  if (const Value* memory = f->Find("memory")) {
    absl::StatusOr<Fields> m = ReadMap(*memory, kMapOfKeys, {"max_keys", "on_full"});
    if (!m.ok()) return m.status();
    if (const Value* x = m->Find("max_keys")) {
      SLUICE_ASSIGN_OR_RETURN(out.max_keys, ReadInt(*x, 1, kInt64Max));
    }
    if (const Value* x = m->Find("on_full")) {
      SLUICE_ASSIGN_OR_RETURN(out.on_full, ReadChoice<OnFull>(*x, {{"remember", OnFull::kRemember},
                                                                   {"deny_new", OnFull::kDenyNew},
                                                                   {"evict", OnFull::kEvict}}));
    }
  }
  if (const Value* redis = f->Find("redis")) {
    absl::StatusOr<Fields> r =
        ReadMap(*redis, kMapOfKeys,
                {"url", "cluster", "sentinel", "user", "password", "password_env", "database",
                 "timeout", "connect_timeout", "key_prefix", "cache_denials", "max_batch", "linger",
                 "calls_in_flight", "window_state", "tls"});
    if (!r.ok()) return r.status();
    RedisStoreOptions& o = out.redis.emplace();
    const Value* url = r->Find("url");
    const Value* cluster = r->Find("cluster");
    const Value* sentinel = r->Find("sentinel");
    if ((url != nullptr) + (cluster != nullptr) + (sentinel != nullptr) != 1) {
      return Fail(*redis,
                  "give exactly one of url (one server), cluster (a list of nodes) and sentinel "
                  "(the sentinels of a master)");
    }
    if (url != nullptr) {
      absl::StatusOr<std::string> text = ReadScalar(*url, "a URL such as redis://127.0.0.1:6379");
      if (!text.ok()) return text.status();
      absl::StatusOr<RedisUrl> parsed = ParseRedisUrl(*text);
      if (!parsed.ok()) return Fail(*url, parsed.status());
      o.url = *text;
      o.tls.enabled = parsed->tls;
    }
    if (cluster != nullptr) SLUICE_RETURN_IF_ERROR(ReadRedisNodes(*cluster, "7000", o.cluster));
    if (sentinel != nullptr) SLUICE_RETURN_IF_ERROR(ReadRedisSentinel(*sentinel, o.sentinel));
    for (auto [key, field] : {std::pair<const char*, std::string*>{"user", &o.user},
                              {"password", &o.password},
                              {"key_prefix", &o.key_prefix}}) {
      if (const Value* x = r->Find(key)) {
        absl::StatusOr<std::string> text = ReadScalar(*x, "a string");
        if (!text.ok()) return text.status();
        *field = *text;
      }
    }
    if (o.key_prefix.find_first_of("{}") != std::string::npos) {
      return Fail(*r->Find("key_prefix"), "no '{' or '}': they would move the keys' hash tag");
    }
    if (const Value* x = r->Find("password_env")) {
      if (r->Find("password") != nullptr)
        return Fail(*x, "give password or password_env, not both");
      SLUICE_ASSIGN_OR_RETURN(o.password, ReadEnvironment(*x));
    }
    if (const Value* x = r->Find("database")) {
      if (cluster != nullptr) return Fail(*x, "a Redis Cluster has only database 0");
      SLUICE_ASSIGN_OR_RETURN(const int64_t db, ReadInt(*x, 0, 1'000'000));
      o.database = static_cast<int>(db);
    }
    if (const Value* x = r->Find("timeout")) {
      SLUICE_ASSIGN_OR_RETURN(o.timeout, ReadDuration(*x, kTimeout));
    }
    if (const Value* x = r->Find("connect_timeout")) {
      SLUICE_ASSIGN_OR_RETURN(o.connect_timeout, ReadDuration(*x, kTimeout));
    }
    if (const Value* x = r->Find("cache_denials")) {
      SLUICE_ASSIGN_OR_RETURN(o.cache_denials, ReadBool(*x));
    }
    if (const Value* x = r->Find("max_batch")) {
      SLUICE_ASSIGN_OR_RETURN(const int64_t batch, ReadInt(*x, 1, 1024));
      o.max_batch = static_cast<int>(batch);
    }
    if (const Value* x = r->Find("linger")) {
      SLUICE_ASSIGN_OR_RETURN(o.linger, ReadDuration(*x, {.max = Duration::Millis(10)}));
    }
    if (const Value* x = r->Find("calls_in_flight")) {
      SLUICE_ASSIGN_OR_RETURN(const int64_t calls, ReadInt(*x, 1, 16));
      o.calls_in_flight = static_cast<int>(calls);
    }
    if (const Value* x = r->Find("window_state")) {
      SLUICE_ASSIGN_OR_RETURN(o.window_state,
                              ReadChoice<WindowState>(*x, {{"text", WindowState::kText},
                                                           {"integer", WindowState::kInteger}}));
    }
    if (const Value* x = r->Find("tls")) {
      if (url != nullptr && !o.tls.enabled) {
        return Fail(*x, "the url is plain (redis:// or unix://): write rediss:// for TLS");
      }
      SLUICE_RETURN_IF_ERROR(ReadRedisTls(*x, o.tls));
    }
  }
  return absl::OkStatus();
}

// A list of Redis nodes, "host:port" (a Cluster's, or sentinels).
absl::Status Parser::ReadRedisNodes(const Value& v, std::string_view example_port,
                                    std::vector<std::string>& out) const {
  absl::StatusOr<std::vector<Value>> nodes = ReadList(v, "nodes (host:port)");
  if (!nodes.ok()) return nodes.status();
  if (nodes->empty()) return Fail(v, "at least one node (host:port)");
  for (const Value& node : *nodes) {
    absl::StatusOr<std::string> text =
        ReadScalar(node, Cat("a node such as 127.0.0.1:", example_port));
    if (!text.ok()) return text.status();
    absl::StatusOr<RedisUrl> parsed = ParseRedisUrl(Cat("redis://", *text));
    if (!parsed.ok() || !parsed->user.empty() || !parsed->password.empty() ||
        parsed->database != 0) {
      return Fail(node, Cat("\"", *text, "\": expected host:port"));
    }
    out.push_back(*text);
  }
  return absl::OkStatus();
}

// store.redis.sentinel: the master's name, some sentinels, and the
// sentinels' own credentials (the master's are store.redis's).
absl::Status Parser::ReadRedisSentinel(const Value& v, RedisSentinel& out) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys, {"master", "nodes", "user", "password", "password_env"});
  if (!f.ok()) return f.status();
  const Value* master = f->Find("master");
  const Value* nodes = f->Find("nodes");
  if (master == nullptr || nodes == nullptr) {
    return Fail(v, "give master (the name the sentinels monitor) and nodes (sentinels, host:port)");
  }
  SLUICE_ASSIGN_OR_RETURN(out.master, ReadScalar(*master, "the master's name"));
  if (out.master.empty() || out.master.find_first_of(" \t\r\n") != std::string::npos) {
    return Fail(*master, "expected the name the sentinels monitor the master by");
  }
  SLUICE_RETURN_IF_ERROR(ReadRedisNodes(*nodes, "26379", out.nodes));
  for (auto [key, field] :
       {std::pair<const char*, std::string*>{"user", &out.user}, {"password", &out.password}}) {
    if (const Value* x = f->Find(key)) {
      SLUICE_ASSIGN_OR_RETURN(*field, ReadScalar(*x, "a string"));
    }
  }
  if (const Value* x = f->Find("password_env")) {
    if (f->Find("password") != nullptr) return Fail(*x, "give password or password_env, not both");
    SLUICE_ASSIGN_OR_RETURN(out.password, ReadEnvironment(*x));
  }
  return absl::OkStatus();
}

// A variable of the environment, named by the value (a password's).
absl::StatusOr<std::string> Parser::ReadEnvironment(const Value& v) const {
  absl::StatusOr<std::string> name = ReadScalar(v, "an environment variable's name");
  if (!name.ok()) return name.status();
  const char* value = std::getenv(name->c_str());
  if (value == nullptr) return Fail(v, Cat("the environment has no ", *name));
  return std::string(value);
}

// store.redis.tls: `true`, or the files and the name to verify. Each file
// must be readable now (a path relative to this file's folder); the client
// reads them when it connects.
absl::Status Parser::ReadRedisTls(const Value& v, RedisTls& out) const {
  if (v.node.IsScalar()) {
    SLUICE_ASSIGN_OR_RETURN(const bool on, ReadBool(v));
    if (!on) return Fail(v, "TLS cannot be turned off here: remove the key (or use redis://)");
    out.enabled = true;
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys, {"ca_file", "cert_file", "key_file", "server_name"});
  if (!f.ok()) return f.status();
  out.enabled = true;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"ca_file", &out.ca_file},
                            {"cert_file", &out.cert_file},
                            {"key_file", &out.key_file}}) {
    if (const Value* x = f->Find(key)) {
      SLUICE_ASSIGN_OR_RETURN(*field, ReadPemFile(*x));
    }
  }
  if ((f->Find("cert_file") == nullptr) != (f->Find("key_file") == nullptr)) {
    return Fail(v, "give cert_file and key_file together (the client's certificate and its key)");
  }
  if (const Value* x = f->Find("server_name")) {
    SLUICE_ASSIGN_OR_RETURN(out.server_name, ReadScalar(*x, "a host name"));
    if (out.server_name.empty()) return Fail(*x, "expected a host name");
  }
  return absl::OkStatus();
}

// A certificate, key or authorities file: a path relative to this file's
// folder, readable now.
absl::StatusOr<std::string> Parser::ReadPemFile(const Value& v) const {
  SLUICE_ASSIGN_OR_RETURN(const std::string given, ReadScalar(v, "a file path"));
  if (given.empty()) return Fail(v, "expected a file path");
  std::string path = internal::PathBeside(source(), given);
  // A certificate or key is a few KiB; a chain of many, less than 1 MiB.
  absl::StatusOr<std::string> text = internal::ReadTextFile(path, 1 << 20);
  if (!text.ok()) return Fail(v, text.status());
  return path;
}

// server.tls, server.decision.tls and grpc.tls: the listener's certificate and key,
// and the authorities of its clients' certificates for mutual TLS.
// `true` (envoyproxy/ratelimit's names), `false`, or {limit, remaining,
// reset}: the names, each a header name sluice does not send itself.
absl::Status Parser::ReadEnvoyLimitHeaders(const Value& v, bool legacy_headers,
                                           std::optional<EnvoyLimitHeaders>& out) const {
  if (v.node.IsScalar()) {
    SLUICE_ASSIGN_OR_RETURN(const bool on, ReadBool(v));
    if (on) out.emplace();
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, "true, or a map of header names", {"limit", "remaining", "reset"});
  if (!f.ok()) return f.status();
  EnvoyLimitHeaders names;
  std::vector<std::string> seen;
  for (const auto& [key, name] : {std::pair{"limit", &names.limit},
                                  {"remaining", &names.remaining},
                                  {"reset", &names.reset}}) {
    if (const Value* x = f->Find(key)) {
      SLUICE_ASSIGN_OR_RETURN(*name, ReadScalar(*x, "a header name such as RateLimit-Limit"));
      if (!IsToken(*name) || name->size() > internal::kMaxNameLength) {
        return Fail(*x, Cat("\"", *name, "\" is not a header name of at most ",
                            internal::kMaxNameLength, " bytes"));
      }
    }
    const std::string lower = internal::AsciiLower(*name);
    const bool legacy = lower == "x-ratelimit-limit" || lower == "x-ratelimit-remaining" ||
                        lower == "x-ratelimit-reset";
    if (lower == "ratelimit" || lower == "ratelimit-policy" || lower == "retry-after" ||
        lower == "content-type" || (legacy && legacy_headers)) {
      return Fail(f->Find(key) != nullptr ? *f->Find(key) : v,
                  Cat("\"", *name, "\": sluice sends this header itself",
                      legacy ? " (server.legacy_headers)" : ""));
    }
    if (std::find(seen.begin(), seen.end(), lower) != seen.end()) {
      return Fail(f->Find(key) != nullptr ? *f->Find(key) : v,
                  Cat("\"", *name, "\" names two of limit, remaining and reset"));
    }
    seen.push_back(lower);
  }
  out = std::move(names);
  return absl::OkStatus();
}

absl::Status Parser::ReadListenerTls(const Value& v, std::optional<ListenerTls>& out) const {
  absl::StatusOr<Fields> f = ReadMap(
      v, kMapOfKeys, {"cert_file", "key_file", "client_ca_file", "client_name", "certificates"});
  if (!f.ok()) return f.status();
  if (f->Find("cert_file") == nullptr || f->Find("key_file") == nullptr) {
    return Fail(v, "give cert_file and key_file (the listener's certificate and its key)");
  }
  ListenerTls tls;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"cert_file", &tls.cert_file},
                            {"key_file", &tls.key_file},
                            {"client_ca_file", &tls.client_ca_file}}) {
    if (const Value* x = f->Find(key)) {
      SLUICE_ASSIGN_OR_RETURN(*field, ReadPemFile(*x));
    }
  }
  if (const Value* x = f->Find("client_name")) {
    if (tls.client_ca_file.empty()) {
      return Fail(*x, "a client certificate's name is checked with client_ca_file: set it");
    }
    SLUICE_ASSIGN_OR_RETURN(tls.client_name, ReadScalar(*x, "a host name or an address"));
    if (tls.client_name.empty()) return Fail(*x, "expected a host name or an address");
  }
  if (const Value* x = f->Find("certificates")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "certificates chosen by SNI");
    if (!items.ok()) return items.status();
    for (const Value& item : *items) {
      absl::StatusOr<Fields> one = ReadMap(item, kMapOfKeys, {"cert_file", "key_file"});
      if (!one.ok()) return one.status();
      const Value* cert = one->Find("cert_file");
      const Value* key = one->Find("key_file");
      if (cert == nullptr || key == nullptr) {
        return Fail(item, "give cert_file and key_file (a certificate and its key)");
      }
      auto& [cert_file, key_file] = tls.certificates.emplace_back();
      SLUICE_ASSIGN_OR_RETURN(cert_file, ReadPemFile(*cert));
      SLUICE_ASSIGN_OR_RETURN(key_file, ReadPemFile(*key));
    }
  }
  out = std::move(tls);
  return absl::OkStatus();
}

absl::Status Parser::ReadTrustedProxies(const Value& v, std::vector<Cidr>& out) const {
  absl::StatusOr<std::vector<Value>> items = ReadList(v, "addresses or networks");
  if (!items.ok()) return items.status();
  for (const Value& item : *items) {
    SLUICE_ASSIGN_OR_RETURN(
        const Cidr cidr, ReadParsed(item, "an address or network such as 10.0.0.0/8", ParseCidr));
    out.push_back(cidr);
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadClientIpPrefix(const Value& v, ClientIpPrefix& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys, {"ipv4", "ipv6"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("ipv4")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t bits, ReadInt(*x, 1, 32));
    out.ipv4 = static_cast<int>(bits);
  }
  if (const Value* x = f->Find("ipv6")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t bits, ReadInt(*x, 1, 128));
    out.ipv6 = static_cast<int>(bits);
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadMatch(const Value& v, MatchConfig& out) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys, {"path_prefix", "path", "method", "host", "headers"});
  if (!f.ok()) return f.status();
  for (std::string_view key : {"path_prefix", "path"}) {
    const Value* x = f->Find(key);
    if (x == nullptr) continue;
    absl::StatusOr<std::string> path = ReadScalar(*x, "a path such as /login");
    if (!path.ok()) return path.status();
    if (path->empty() || path->front() != '/') {
      return Fail(*x, Cat("must start with '/', got \"", *path, "\""));
    }
    (key == "path" ? out.path : out.path_prefix) = *path;
  }
  if (out.path && out.path_prefix) {
    return Fail(*f->Find("path"), "set path (exact) or path_prefix, not both");
  }
  if (const Value* x = f->Find("method")) {
    absl::StatusOr<std::string> method = ReadScalar(*x, "an HTTP method such as POST");
    if (!method.ok()) return method.status();
    if (!IsToken(*method)) return Fail(*x, Cat("\"", *method, "\" is not an HTTP method"));
    out.method = Upper(*method);
  }
  if (const Value* x = f->Find("host")) {
    absl::StatusOr<std::string> host = ReadScalar(*x, "a host name such as example.com");
    if (!host.ok()) return host.status();
    const bool bracketed = !host->empty() && host->front() == '[' && host->back() == ']';
    if (!bracketed && host->find(':') != std::string::npos) {
      return Fail(*x, Cat("host \"", *host, "\" is matched without its port; drop the \":...\""));
    }
    const bool valid =
        bracketed || (!host->empty() && std::all_of(host->begin(), host->end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
        }));
    if (!valid) return Fail(*x, Cat("\"", *host, "\" is not a host name"));
    out.host = internal::AsciiLower(*host);
    // A fully qualified name ("example.com.") is the name: requests are
    // matched without the dot too (policy::HostName).
    if (!bracketed && out.host->size() > 1 && out.host->back() == '.') out.host->pop_back();
  }
  if (const Value* x = f->Find("headers")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "header names");
    if (!items.ok()) return items.status();
    for (const Value& item : *items) {
      absl::StatusOr<std::string> name = ReadScalar(item, "a header name");
      if (!name.ok()) return name.status();
      if (!IsToken(*name)) return Fail(item, Cat("\"", *name, "\" is not a header name"));
      out.headers.push_back(internal::AsciiLower(*name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HostPort> Parser::ReadUpstream(const Value& v, bool& tls) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "a URL such as http://127.0.0.1:3000");
  if (!text.ok()) return text.status();
  const std::string lower = internal::AsciiLower(*text);
  tls = lower.starts_with("https://");
  if (!tls && !lower.starts_with("http://")) {
    return Fail(v, Cat("expected http://HOST:PORT or https://HOST:PORT, got \"", *text, "\""));
  }
  const std::string_view rest = std::string_view(*text).substr(tls ? 8 : 7);
  const size_t end = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, end);
  if (end != std::string_view::npos && rest.substr(end) != "/") {
    return Fail(v, Cat("upstream \"", *text,
                       "\": a path, query or fragment is not supported (only http://HOST:PORT)"));
  }
  if (authority.find('@') != std::string_view::npos) {
    return Fail(v, Cat("upstream \"", *text, "\": user information is not supported"));
  }
  const size_t bracket = authority.rfind(']');
  const size_t colon = authority.rfind(':');
  const bool has_port =
      colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket);
  absl::StatusOr<HostPort> hp =
      ParseHostPort(has_port ? std::string(authority) : Cat(authority, tls ? ":443" : ":80"));
  if (!hp.ok()) return Fail(v, Cat("upstream \"", *text, "\": ", hp.status().message()));
  if (hp->port == 0) return Fail(v, Cat("upstream \"", *text, "\": port 0 cannot be connected to"));
  return hp;
}

absl::Status Parser::ReadRoute(const Value& v, std::map<std::string, int>& names,
                               int64_t server_body_bytes, RouteConfig& out) const {
  if (!v.node.IsMap()) {
    return Fail(v, Cat("expected a route (a map with name, match and upstream), got ",
                       DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys,
              {"name", "match", "upstream", "upstream_ca_file", "upstream_server_name",
               "upstream_cert_file", "upstream_key_file", "host_header", "websocket",
               "upstream_timeout", "idle_timeout", "max_body_bytes", "min_upload_rate"});
  if (!f.ok()) return f.status();
  const Value* name = f->Find("name");
  if (name == nullptr) return Fail(f->Missing("name"), "required");
  SLUICE_RETURN_IF_ERROR(ReadUniqueName(*name, "route", names, out.name));
  if (const Value* x = f->Find("match")) SLUICE_RETURN_IF_ERROR(ReadMatch(*x, out.match));
  const Value* upstream = f->Find("upstream");
  if (upstream == nullptr) return Fail(f->Missing("upstream"), "required (http://HOST:PORT)");
  SLUICE_ASSIGN_OR_RETURN(out.upstream, ReadUpstream(*upstream, out.upstream_tls));
  for (auto [key, field] :
       {std::pair<const char*, std::string*>{"upstream_ca_file", &out.upstream_ca_file},
        {"upstream_cert_file", &out.upstream_cert_file},
        {"upstream_key_file", &out.upstream_key_file}}) {
    if (const Value* x = f->Find(key)) {
      if (!out.upstream_tls)
        return Fail(*x, "the upstream is plain (http://): write https:// for TLS");
      SLUICE_ASSIGN_OR_RETURN(*field, ReadPemFile(*x));
    }
  }
  if (out.upstream_cert_file.empty() != out.upstream_key_file.empty()) {
    return Fail(
        *f->Find(out.upstream_cert_file.empty() ? "upstream_key_file" : "upstream_cert_file"),
        "give upstream_cert_file and upstream_key_file together (sluice's certificate "
        "for the upstream and its key)");
  }
  if (const Value* x = f->Find("upstream_server_name")) {
    if (!out.upstream_tls)
      return Fail(*x, "the upstream is plain (http://): write https:// for TLS");
    SLUICE_ASSIGN_OR_RETURN(out.upstream_server_name, ReadScalar(*x, "a host name"));
    if (out.upstream_server_name.empty()) return Fail(*x, "expected a host name");
  }
  if (const Value* x = f->Find("host_header")) {
    SLUICE_ASSIGN_OR_RETURN(const std::string host, ReadScalar(*x, "client or upstream"));
    if (host != "client" && host != "upstream") {
      return Fail(*x, Cat("expected client (the client's Host) or upstream (the upstream's name), "
                          "got \"",
                          host, "\""));
    }
    out.upstream_host = host == "upstream";
  }
  if (const Value* x = f->Find("websocket")) {
    SLUICE_ASSIGN_OR_RETURN(out.websocket, ReadBool(*x));
  }
  if (const Value* x = f->Find("upstream_timeout")) {
    SLUICE_ASSIGN_OR_RETURN(out.upstream_timeout, ReadDuration(*x, kTimeout));
  }
  if (const Value* x = f->Find("idle_timeout")) {
    if (!out.websocket) {
      return Fail(*x,
                  "only for a route with websocket: true (a tunnel's quiet time); a connection's "
                  "between requests is server.idle_timeout");
    }
    SLUICE_ASSIGN_OR_RETURN(out.idle_timeout, ReadDuration(*x, kTimeout));
  }
  if (const Value* x = f->Find("max_body_bytes")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_body_bytes, ReadInt(*x, 0, kMaxRouteBodyBytes));
  }
  if (const Value* x = f->Find("min_upload_rate")) {
    if (!out.StreamsUploads(server_body_bytes)) {
      return Fail(*x, Cat("only for a route whose max_body_bytes is larger than "
                          "server.max_body_bytes (",
                          server_body_bytes,
                          "): its uploads stream; a body read whole has server.read_timeout "
                          "in all"));
    }
    SLUICE_ASSIGN_OR_RETURN(out.min_upload_rate, ReadInt(*x, 0, kMaxRouteBodyBytes));
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadKey(const Value& v, std::vector<KeyPart>& out) const {
  absl::StatusOr<std::vector<Value>> items = ReadList(v, "key parts");
  if (!items.ok()) return items.status();
  if (items->empty()) {
    return Fail(v, "must not be empty (leave key out for the default [client_ip])");
  }
  static constexpr std::string_view kExpected =
      "client_ip, header:NAME, path, route, client_cert or global";
  std::vector<KeyPart> parts;
  for (const Value& item : *items) {
    if (item.node.IsMap()) {
      return Fail(item,
                  "expected a key part, got a map: write header:NAME without a space after "
                  "the colon, or quote it");
    }
    absl::StatusOr<std::string> text = ReadScalar(item, Cat("a key part (", kExpected, ")"));
    if (!text.ok()) return text.status();
    KeyPart part;
    if (*text == "client_ip") {
      part.kind = KeyPart::Kind::kClientIp;
    } else if (*text == "path") {
      part.kind = KeyPart::Kind::kPath;
    } else if (*text == "route") {
      part.kind = KeyPart::Kind::kRoute;
    } else if (*text == "global") {
      part.kind = KeyPart::Kind::kGlobal;
    } else if (*text == "client_cert") {
      part.kind = KeyPart::Kind::kClientCert;
    } else if (text->starts_with("header:")) {
      part.kind = KeyPart::Kind::kHeader;
      const std::string header = text->substr(7);
      if (!IsToken(header)) {
        return Fail(item, Cat("\"", header, "\" in \"", *text, "\" is not a header name"));
      }
      part.header = internal::AsciiLower(header);
    } else {
      return Fail(item, Cat("unknown key part \"", *text, "\" (expected ", kExpected, ")"));
    }
    if (std::find(parts.begin(), parts.end(), part) != parts.end()) {
      return Fail(item, Cat("key part \"", *text, "\" appears twice"));
    }
    parts.push_back(part);
  }
  const bool has_global = std::any_of(parts.begin(), parts.end(), [](const KeyPart& p) {
    return p.kind == KeyPart::Kind::kGlobal;
  });
  if (has_global && parts.size() > 1) {
    return Fail(v,
                "global is a whole key (one bucket for every request); it does not combine "
                "with other parts");
  }
  out = std::move(parts);
  return absl::OkStatus();
}

absl::StatusOr<LimitSpec> Parser::ReadLimit(const Value& v) const {
  if (!v.node.IsMap()) {
    return Fail(
        v, Cat("expected a limit (a map with algorithm and rate), got ", DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys,
                                     {"algorithm", "rate", "limit", "period", "burst", "mode",
                                      "max_delay", "queue", "scope", "lease", "lease_ttl"});
  if (!f.ok()) return f.status();
  LimitSpec out;
  SLUICE_ASSIGN_OR_RETURN(out.options, ReadLimitOptions(*f));
  SLUICE_ASSIGN_OR_RETURN(out.scope, ReadScope(*f, {.shared_store = shared_store_}));
  const Value* lease_at = f->Find("lease");
  if (const Value* x = lease_at) {
    if (out.scope != Scope::kGlobal) {
      return Fail(*x, "a lease is a slice of a global limit (scope: global, store.redis)");
    }
    SLUICE_ASSIGN_OR_RETURN(out.lease, ReadLease(*x));
  }
  absl::StatusOr<LimitConfig> made = MakeLimit(out.options);
  if (!made.ok()) return Fail(v, made.status());
  if (out.lease.has_value()) {
    if (absl::Status s = ValidateLease(*made, *out.lease); !s.ok()) return Fail(*lease_at, s);
  }
  return out;
}

// rlqs: the quota service (docs/envoy.md, "Quota service").
absl::Status Parser::ReadRlqs(const Value& v, RlqsConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(
      v, kMapOfKeys, {"assignment_ttl", "abandon_after", "max_buckets_per_stream", "domains"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("assignment_ttl")) {
    SLUICE_ASSIGN_OR_RETURN(out.assignment_ttl, ReadDuration(*x, {.min = Duration::Millis(100),
                                                                  .max = Duration::Hours(1)}));
  }
  if (const Value* x = f->Find("abandon_after")) {
    SLUICE_ASSIGN_OR_RETURN(out.abandon_after, ReadDuration(*x, {.min = Duration::Seconds(1),
                                                                 .max = Duration::Days(1)}));
  }
  if (const Value* x = f->Find("max_buckets_per_stream")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_buckets_per_stream, ReadInt(*x, 1, 1'000'000));
  }
  const Value* domains = f->Find("domains");
  if (domains == nullptr) return Fail(f->Missing("domains"), "domains: the domains Envoys report");
  absl::StatusOr<std::vector<Value>> items = ReadList(*domains, "domains");
  if (!items.ok()) return items.status();
  for (const Value& item : *items) {
    absl::StatusOr<Fields> d = ReadMap(item, kMapOfKeys, {"domain", "buckets", "unknown"});
    if (!d.ok()) return d.status();
    RlqsDomainConfig& domain = out.domains.emplace_back();
    const Value* name = d->Find("domain");
    if (name == nullptr) return Fail(d->Missing("domain"), "domain: the name Envoy sends");
    SLUICE_ASSIGN_OR_RETURN(domain.domain, ReadText(*name, "a domain", 256));
    for (size_t i = 0; i + 1 < out.domains.size(); ++i) {
      if (out.domains[i].domain == domain.domain) {
        return Fail(*name, Cat("domain \"", domain.domain, "\" twice"));
      }
    }
    if (const Value* buckets = d->Find("buckets")) {
      absl::StatusOr<std::vector<Value>> list = ReadList(*buckets, "buckets");
      if (!list.ok()) return list.status();
      for (const Value& b : *list) {
        absl::StatusOr<Fields> bf =
            ReadMap(b, kMapOfKeys, {"match", "rate", "limit", "period", "burst", "strategy"});
        if (!bf.ok()) return bf.status();
        RlqsBucketConfig& bucket = domain.buckets.emplace_back();
        const Value* match = bf->Find("match");
        if (match == nullptr) {
          return Fail(bf->Missing("match"), "match: the bucket_id entries this limit is for");
        }
        if (!match->node.IsMap() || match->node.size() == 0) {
          return Fail(*match, "expected a map of bucket_id keys and values (\"*\": any value)");
        }
        for (const auto& kv : match->node) {
          if (!kv.first.IsScalar() || !kv.second.IsScalar() || kv.first.Scalar().empty() ||
              kv.second.Scalar().empty()) {
            return Fail(*match, "bucket_id keys and values are non-empty text");
          }
          bucket.match.emplace_back(kv.first.Scalar(), kv.second.Scalar());
        }
        std::sort(bucket.match.begin(), bucket.match.end());
        SLUICE_RETURN_IF_ERROR(ReadRlqsLimit(*bf, bucket.limit));
      }
    }
    if (const Value* unknown = d->Find("unknown")) {
      if (unknown->node.IsScalar()) {
        SLUICE_ASSIGN_OR_RETURN(
            domain.unknown,
            ReadChoice<RlqsUnknown>(*unknown, {{"deny_all", RlqsUnknown::kDenyAll},
                                               {"allow_all", RlqsUnknown::kAllowAll}}));
      } else {
        absl::StatusOr<Fields> uf =
            ReadMap(*unknown, "deny_all, allow_all or a limit ({rate: ...})",
                    {"rate", "limit", "period", "burst", "strategy"});
        if (!uf.ok()) return uf.status();
        domain.unknown = RlqsUnknown::kLimit;
        SLUICE_RETURN_IF_ERROR(ReadRlqsLimit(*uf, domain.unknown_limit));
      }
    }
  }
  return absl::OkStatus();
}

// rate (or limit and period), burst, strategy.
absl::Status Parser::ReadRlqsLimit(const Fields& f, RlqsLimitConfig& out) const {
  SLUICE_ASSIGN_OR_RETURN(out.rate, ReadLimitRate(f));
  if (const Value* x = f.Find("burst")) {
    SLUICE_ASSIGN_OR_RETURN(out.burst, ReadInt(*x, 1, UINT32_MAX));
  }
  if (const Value* x = f.Find("strategy")) {
    SLUICE_ASSIGN_OR_RETURN(
        out.requests_per_time_unit,
        ReadChoice<bool>(*x, {{"token_bucket", false}, {"requests_per_time_unit", true}}));
  }
  return absl::OkStatus();
}

// lease: {size: auto | N, ttl: D}; both optional.
absl::StatusOr<LeaseOptions> Parser::ReadLease(const Value& v) const {
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys, {"size", "ttl"});
  if (!f.ok()) return f.status();
  LeaseOptions out;
  if (const Value* x = f->Find("size")) {
    if (x->node.IsScalar() && x->node.Scalar() == "auto") {
      out.size = 0;
    } else {
      SLUICE_ASSIGN_OR_RETURN(out.size, ReadInt(*x, 1, int64_t{1} << 40));
    }
  }
  if (const Value* x = f->Find("ttl")) {
    SLUICE_ASSIGN_OR_RETURN(
        out.ttl, ReadDuration(*x, {.min = Duration::Millis(1), .max = Duration::Minutes(60)}));
  }
  return out;
}

absl::Status Parser::ReadDeny(const Value& v, DenyConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, kMapOfKeys, {"status", "retry_after_jitter"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("status")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t status, ReadInt(*x, 400, 599));
    out.status = static_cast<int>(status);
  }
  if (const Value* x = f->Find("retry_after_jitter")) {
    SLUICE_ASSIGN_OR_RETURN(out.retry_after_jitter, ReadDuration(*x));
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadPolicy(const Value& v, std::map<std::string, int>& names,
                                PolicyConfig& out) const {
  if (!v.node.IsMap()) {
    return Fail(v,
                Cat("expected a policy (a map with name and limits), got ", DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, kMapOfKeys,
              {"name", "match", "key", "on_missing_key", "client_ip_prefix", "limits", "shadow",
               "on_deny", "on_store_error", "long_keys", "cost"});
  if (!f.ok()) return f.status();
  const Value* name = f->Find("name");
  if (name == nullptr) return Fail(f->Missing("name"), "required");
  SLUICE_RETURN_IF_ERROR(ReadUniqueName(*name, "policy", names, out.name));
  if (const Value* x = f->Find("match")) {
    out.match.emplace();
    SLUICE_RETURN_IF_ERROR(ReadMatch(*x, *out.match));
  }
  out.key = {KeyPart{.kind = KeyPart::Kind::kClientIp, .header = ""}};
  if (const Value* x = f->Find("key")) SLUICE_RETURN_IF_ERROR(ReadKey(*x, out.key));
  if (const Value* x = f->Find("on_missing_key")) {
    SLUICE_ASSIGN_OR_RETURN(out.on_missing_key,
                            ReadChoice<MissingKey>(*x, {{"deny", MissingKey::kDeny},
                                                        {"client_ip", MissingKey::kClientIp}}));
  }
  out.client_ip_prefix = client_ip_prefix_;
  if (const Value* x = f->Find("client_ip_prefix")) {
    SLUICE_RETURN_IF_ERROR(ReadClientIpPrefix(*x, out.client_ip_prefix));
  }

  const Value* limits = f->Find("limits");
  if (limits == nullptr) {
    return Fail(f->Missing("limits"), "required: a policy needs at least one limit");
  }
  absl::StatusOr<std::vector<Value>> items = ReadList(*limits, "limits");
  if (!items.ok()) return items.status();
  if (items->empty()) return Fail(*limits, "must not be empty: a policy needs at least one limit");
  std::optional<size_t> shape;
  for (size_t i = 0; i < items->size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(const LimitSpec spec, ReadLimit((*items)[i]));
    const bool is_shape =
        spec.options.algorithm == Algorithm::kLeakyBucket && spec.options.mode == LeakyMode::kShape;
    if (is_shape && shape) {
      return Fail((*items)[i], Cat("at most one leaky_bucket shape limit per policy (limits[",
                                   *shape, "] is one already)"));
    }
    if (is_shape) shape = i;
    out.limits.push_back(spec);
  }

  if (const Value* x = f->Find("shadow")) {
    SLUICE_ASSIGN_OR_RETURN(out.shadow, ReadBool(*x));
  }
  if (const Value* x = f->Find("on_deny")) SLUICE_RETURN_IF_ERROR(ReadDeny(*x, out.on_deny));
  if (const Value* x = f->Find("on_store_error")) {
    SLUICE_ASSIGN_OR_RETURN(out.on_store_error,
                            ReadChoice<OnStoreError>(*x, {{"allow", OnStoreError::kAllow},
                                                          {"deny", OnStoreError::kDeny},
                                                          {"local", OnStoreError::kLocal}}));
  }
  if (const Value* x = f->Find("long_keys")) {
    SLUICE_ASSIGN_OR_RETURN(
        out.long_keys,
        ReadChoice<LongKeys>(*x, {{"hash", LongKeys::kHash}, {"refuse", LongKeys::kRefuse}}));
  }
  if (const Value* x = f->Find("cost")) SLUICE_RETURN_IF_ERROR(ReadCost(*x, out));
  return absl::OkStatus();
}

// cost: N, or {estimate: N, settle: "response_header:NAME"} (settled costs:
// every limit that takes cost must carry debt, and not be leased).
absl::Status Parser::ReadCost(const Value& v, PolicyConfig& out) const {
  if (v.node.IsScalar()) {
    SLUICE_ASSIGN_OR_RETURN(out.cost.estimate, ReadInt(v, 0, kMaxLimit));
    return absl::OkStatus();
  }
  absl::StatusOr<Fields> f =
      ReadMap(v, "a cost, or {estimate: N, settle: ...}", {"estimate", "settle"});
  if (!f.ok()) return f.status();
  const Value* estimate = f->Find("estimate");
  if (estimate == nullptr) return Fail(f->Missing("estimate"), "required (the cost reserved)");
  SLUICE_ASSIGN_OR_RETURN(out.cost.estimate, ReadInt(*estimate, 0, kMaxLimit));
  const Value* settle = f->Find("settle");
  if (settle == nullptr) return absl::OkStatus();
  SLUICE_ASSIGN_OR_RETURN(const std::string source, ReadScalar(*settle, "response_header:NAME"));
  constexpr std::string_view kPrefix = "response_header:";
  const std::string_view header =
      source.starts_with(kPrefix) ? std::string_view(source).substr(kPrefix.size()) : "";
  if (header.empty() || header.size() > 256 ||
      !std::all_of(header.begin(), header.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
      })) {
    return Fail(*settle, "expected response_header:NAME (a header of the upstream's answer)");
  }
  for (size_t i = 0; i < out.limits.size(); ++i) {
    const LimitSpec& limit = out.limits[i];
    const Algorithm a = limit.options.algorithm;
    const bool shape = a == Algorithm::kLeakyBucket && limit.options.mode == LeakyMode::kShape;
    if (a == Algorithm::kConcurrency || shape) continue;  // settles leave them alone
    if (a != Algorithm::kTokenBucket && a != Algorithm::kGcra && a != Algorithm::kFixedWindow &&
        a != Algorithm::kSlidingWindow) {
      return Fail(*settle, Cat("limits[", i, "] (", AlgorithmName(a),
                               ") cannot carry debt; settled costs need token_bucket, gcra, "
                               "fixed_window or sliding_window"));
    }
    if (limit.lease.has_value()) {
      return Fail(*settle, Cat("limits[", i,
                               "] is leased: its slices are spent in this process, and a settled "
                               "difference would bypass them"));
    }
  }
  out.cost.response_header = std::string(header);
  return absl::OkStatus();
}

absl::Status Parser::ReadUniqueName(const Value& v, std::string_view what,
                                    std::map<std::string, int>& names, std::string& out) const {
  SLUICE_ASSIGN_OR_RETURN(out, ReadName(v, internal::NameChars::kToken));
  const auto [it, inserted] = names.emplace(out, v.line);
  if (!inserted) {
    return Fail(v, Cat("duplicate ", what, " name \"", out, "\" (first at line ", it->second, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> Parser::Run(std::string_view yaml) {
  absl::StatusOr<std::optional<Value>> document = ReadDocument(yaml, "a config file");
  if (!document.ok()) return document.status();
  Config config;
  config.source = source();
  if (!document->has_value()) {  // empty, or only comments: a server that limits nothing
    if (!options_.allow_empty) {
      return absl::InvalidArgumentError(
          Cat(source(),
              ": the file is empty (or holds only comments); the config in force stays "
              "(an editor rewriting the file can leave it empty for a moment)"));
    }
    return config;
  }
  const Value& root = **document;
  if (!root.node.IsNull() && !root.node.IsMap()) {
    return Fail(root, Cat("expected a map of top-level keys (server, store, trusted_proxies, "
                          "routes, policies), got ",
                          DescribeNode(root.node)));
  }
  absl::StatusOr<Fields> f =
      ReadMap(root, kMapOfKeys,
              {"server", "store", "trusted_proxies", "real_ip_header", "client_ip_prefix", "routes",
               "policies", "grpc", "envoy", "envoy_files", "envoy_shadow_mode",
               "envoy_merge_domains", "envoy_limit_headers", "rlqs"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("server")) SLUICE_RETURN_IF_ERROR(ReadServer(*x, config.server));
  if (const Value* x = f->Find("store")) SLUICE_RETURN_IF_ERROR(ReadStore(*x, config.store));
  shared_store_ = config.store.redis.has_value();
  if (const Value* x = f->Find("trusted_proxies")) {
    SLUICE_RETURN_IF_ERROR(ReadTrustedProxies(*x, config.trusted_proxies));
  }
  if (const Value* x = f->Find("real_ip_header")) {
    absl::StatusOr<std::string> name = ReadScalar(*x, "a header name such as X-Real-IP");
    if (!name.ok()) return name.status();
    if (!IsToken(*name)) return Fail(*x, Cat("\"", *name, "\" is not a header name"));
    if (config.trusted_proxies.empty()) {
      return Fail(*x, "needs trusted_proxies: the header is believed only from those peers");
    }
    config.real_ip_header = internal::AsciiLower(*name);
  }
  if (const Value* x = f->Find("client_ip_prefix")) {
    SLUICE_RETURN_IF_ERROR(ReadClientIpPrefix(*x, config.client_ip_prefix));
    client_ip_prefix_ = config.client_ip_prefix;
  }
  if (const Value* x = f->Find("routes")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "routes");
    if (!items.ok()) return items.status();
    std::map<std::string, int> names;
    for (const Value& item : *items) {
      RouteConfig route;
      SLUICE_RETURN_IF_ERROR(ReadRoute(item, names, config.server.max_body_bytes, route));
      config.routes.push_back(std::move(route));
    }
  }
  if (const Value* x = f->Find("policies")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "policies");
    if (!items.ok()) return items.status();
    std::map<std::string, int> names;
    for (const Value& item : *items) {
      PolicyConfig policy;
      SLUICE_RETURN_IF_ERROR(ReadPolicy(item, names, policy));
      for (const LimitSpec& limit : policy.limits) {
        if (limit.options.algorithm != Algorithm::kConcurrency || config.routes.empty()) continue;
        const Duration ttl = limit.options.lease_ttl == Duration::Zero() ? kDefaultLeaseTtl
                                                                         : limit.options.lease_ttl;
        // The gateway holds a slot until the upstream answers or times out
        // (a route's own timeout included).
        std::string longest = "server.upstream_timeout";
        Duration wait = config.server.upstream_timeout;
        for (const RouteConfig& route : config.routes) {
          if (route.upstream_timeout > wait) {
            wait = route.upstream_timeout;
            longest = Cat("routes \"", route.name, "\" upstream_timeout");
          }
          // An upload is renewed as its parts come (gateway.cc): one may
          // be waited for that long.
          if (route.StreamsUploads(config.server.max_body_bytes) &&
              config.server.read_timeout > wait) {
            wait = config.server.read_timeout;
            longest = Cat("server.read_timeout (routes \"", route.name, "\" streams uploads)");
          }
        }
        if (ttl <= wait) {
          return Fail(item, Cat("policy \"", policy.name, "\": lease_ttl ", FormatDuration(ttl),
                                " must be longer than ", longest, " (", FormatDuration(wait),
                                "), or a slow answer's slot would end before it"));
        }
      }
      config.policies.push_back(std::move(policy));
    }
  }
  // grpc, envoy, envoy_files: the Envoy rate limit service (config/envoy_config.cc).
  if (const Value* x = f->Find("grpc")) {
    absl::StatusOr<Fields> g =
        ReadMap(*x, kMapOfKeys,
                {"listen", "max_connections", "handshake_timeout", "idle_timeout",
                 "max_connection_age", "max_connection_age_grace", "tls"});
    if (!g.ok()) return g.status();
    GrpcConfig& grpc = config.grpc.emplace();
    if (const Value* listen = g->Find("listen")) {
      SLUICE_ASSIGN_OR_RETURN(grpc.listen, ReadHostPort(*listen));
      for (const HostPort& other : {config.server.listen, config.server.admin,
                                    config.server.decision.listen.value_or(HostPort{"", 0})}) {
        if (grpc.listen == other && other.port != 0) {
          return Fail(*listen,
                      "same address as server.listen, server.admin or server.decision.listen; "
                      "gRPC needs its own");
        }
      }
    }
    if (const Value* v = g->Find("max_connections")) {
      SLUICE_ASSIGN_OR_RETURN(grpc.max_connections, ReadInt(*v, 1, kMaxGrpcConnections));
    }
    const std::pair<std::string_view, Duration*> grpc_timeouts[] = {
        {"handshake_timeout", &grpc.handshake_timeout},
        {"idle_timeout", &grpc.idle_timeout},
        {"max_connection_age", &grpc.max_connection_age},
        {"max_connection_age_grace", &grpc.max_connection_age_grace},
    };
    for (const auto& [key, field] : grpc_timeouts) {
      if (const Value* v = g->Find(key)) {
        SLUICE_ASSIGN_OR_RETURN(*field, ReadDuration(*v, kTimeout));
      }
    }
    if (const Value* v = g->Find("tls")) SLUICE_RETURN_IF_ERROR(ReadListenerTls(*v, grpc.tls));
  }
  if (const Value* x = f->Find("rlqs")) {
    if (!config.grpc.has_value()) {
      return Fail(*x, "the quota service is served on grpc.listen: set grpc");
    }
    SLUICE_RETURN_IF_ERROR(ReadRlqs(*x, config.rlqs.emplace()));
  }
  // envoy, envoy_files and what applies to all their domains.
  const bool envoy_rules = f->Find("envoy") != nullptr || f->Find("envoy_files") != nullptr;
  bool merge_domains = false, shadow_mode = false;
  if (const Value* x = f->Find("envoy_merge_domains")) {
    if (!envoy_rules) return Fail(*x, "merges envoy domains: set envoy or envoy_files");
    SLUICE_ASSIGN_OR_RETURN(merge_domains, ReadBool(*x));
  }
  if (const Value* x = f->Find("envoy_shadow_mode")) {
    if (!envoy_rules) return Fail(*x, "shadows the envoy rules: set envoy or envoy_files");
    SLUICE_ASSIGN_OR_RETURN(shadow_mode, ReadBool(*x));
  }
  std::optional<EnvoyLimitHeaders> response_headers, request_headers;
  if (const Value* x = f->Find("envoy_limit_headers")) {
    if (!envoy_rules) return Fail(*x, "names headers of the envoy rules: set envoy or envoy_files");
    absl::StatusOr<Fields> h = ReadMap(*x, kMapOfKeys, {"response", "request"});
    if (!h.ok()) return h.status();
    if (const Value* r = h->Find("response")) {
      SLUICE_RETURN_IF_ERROR(
          ReadEnvoyLimitHeaders(*r, config.server.legacy_headers, response_headers));
    }
    if (const Value* r = h->Find("request")) {
      SLUICE_RETURN_IF_ERROR(
          ReadEnvoyLimitHeaders(*r, config.server.legacy_headers, request_headers));
    }
  }
  if (envoy_rules) {
    auto at = [](const Value* v) {
      return v == nullptr ? std::nullopt
                          : std::optional<internal::YamlAt>({v->node, v->path, v->line});
    };
    absl::StatusOr<std::shared_ptr<EnvoyConfig>> envoy =
        internal::ReadEnvoySection(source(), at(f->Find("envoy")), at(f->Find("envoy_files")),
                                   {.shared_store = shared_store_, .merge_domains = merge_domains});
    if (!envoy.ok()) return envoy.status();
    (*envoy)->shadow_mode = shadow_mode;
    (*envoy)->response_limit_headers = std::move(response_headers);
    (*envoy)->request_limit_headers = std::move(request_headers);
    config.envoy = *std::move(envoy);
  }
  return config;
}

}  // namespace

absl::StatusOr<Config> ParseConfig(std::string_view yaml, const std::string& source,
                                   ConfigLoadOptions options) {
  Parser parser(source, options);
  try {
    return parser.Run(yaml);
  } catch (const YAML::Exception& e) {
    // The walk checks every node's type before reading it; this is a guard.
    return absl::InvalidArgumentError(Cat(source, ": cannot read the YAML: ", e.what()));
  }
}

std::vector<std::string> ConfigWarnings(const Config& config) {
  std::vector<std::string> out;
  if (config.envoy == nullptr) return out;
  for (const EnvoyDomain& domain : config.envoy->domains) {
    out.insert(out.end(), domain.warnings.begin(), domain.warnings.end());
  }
  return out;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, ConfigLoadOptions options) {
  absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
  if (!text.ok()) return text.status();
  return ParseConfig(*text, path, options);
}

int ServerConfig::Loops() const { return threads > 0 ? threads : UsableCpus(); }

}  // namespace sluice
