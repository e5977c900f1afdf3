// sluice/config.h: what `sluice serve --config FILE` runs, as plain structs.
//
// LoadConfig reads the YAML file (docs/configuration.md documents every key)
// and validates all of it before anything starts: an error names the file,
// the line and the key ("gateway.yaml:14: policies[0].limits[1].rate: ...").
// Unknown keys are errors too, so a typo never silently disables a limit.
//
// Thread-safety: plain values; LoadConfig is reentrant.
//
//   absl::StatusOr<sluice::Config> config = sluice::LoadConfigFile("examples/quickstart.yaml");
//   if (!config.ok()) { std::cerr << config.status().message(); return 2; }
#ifndef SLUICE_CONFIG_H_
#define SLUICE_CONFIG_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/limiter.h"
#include "sluice/store/redis_options.h"
#include "sluice/time.h"

namespace sluice {

struct HostPort {
  std::string host;  // an IP literal or a name ("127.0.0.1", "::1", "localhost")
  uint16_t port = 0;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// "127.0.0.1:8080", "[::1]:8080", "localhost:80". Port 0 asks the OS for one.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);

// The text ParseHostPort reads: "127.0.0.1:8080", "[::1]:8080"; without
// ":port" where the port is `default_port` ("localhost" for port 80 and a
// default of 80, as in a Host field).
std::string HostPortText(const HostPort& address, uint16_t default_port = 0);

// An IPv4 or IPv6 network, "10.0.0.0/8", "::1/128"; a bare address is /32 or /128.
struct Cidr {
  std::array<uint8_t, 16> address{};  // IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d)
  int prefix_length = 128;            // over the 128-bit form
  bool Contains(const std::array<uint8_t, 16>& ip) const;
  friend bool operator==(const Cidr&, const Cidr&) = default;
};
absl::StatusOr<Cidr> ParseCidr(std::string_view text);
// Parses an IPv4 or IPv6 address into the 128-bit form Cidr uses.
std::optional<std::array<uint8_t, 16>> ParseIp(std::string_view text);

// server.decision: where the decision API (POST /v1/check) and the NGINX
// auth endpoint (/v1/auth) are served, and who may call them. A caller of
// either spends any key's quota, so they are never served where untrusted
// clients reach the gateway unless the operator says so:
//   - `listen` set: on that listener only (the gateway listener serves routes);
//   - else, no routes configured: on server.listen (a decision service);
//   - else: not served at all, unless `on_gateway_listener: true`.
// With tokens, every call needs "Authorization: Bearer <one of them>".
// TLS on a listener (server.tls, server.decision.tls, grpc.tls): its
// certificate and key, and for mutual TLS the authorities a client's
// certificate must be signed by. Paths as resolved from the config's folder; the files are
// read when the server starts and again at every reload.
struct ListenerTls {
  std::string cert_file;       // the certificate chain (PEM)
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // empty: no client certificate asked for
  std::string client_name;     // set: the name a client's certificate must carry
  // More certificates (cert_file, key_file), each presented to a client
  // whose SNI names one of its DNS names; the others get cert_file.
  std::vector<std::pair<std::string, std::string>> certificates;
  friend bool operator==(const ListenerTls&, const ListenerTls&) = default;
};

struct DecisionConfig {
  std::optional<HostPort> listen;
  std::optional<ListenerTls> tls;  // on `listen` (server.tls covers server.listen)
  bool on_gateway_listener = false;
  // From `tokens` and from the variable `token_env` names (read at load);
  // each at least kMinTokenLength visible ASCII characters.
  std::vector<std::string> tokens;
  // Signs the lease tokens of /v1/acquire (docs/concurrency.md): the value
  // of the variable `lease_secret_env` names, at least kMinTokenLength
  // characters. Empty: a random secret per process (leases are then
  // renewed and released only through the process that gave them).
  std::string lease_secret;
  friend bool operator==(const DecisionConfig&, const DecisionConfig&) = default;
};
inline constexpr size_t kMinTokenLength = 16;
inline constexpr size_t kMaxTokenLength = 512;

// The longest any timeout in the config may be (server.*_timeout,
// store.redis.*timeout): longer ones are refused at load rather than
// overflowing a deadline.
inline constexpr Duration kMaxTimeout = Duration::Days(7);

struct ServerConfig {
  HostPort listen{"127.0.0.1", 8080};  // gateway routes (+ the decision API: see DecisionConfig)
  HostPort admin{"127.0.0.1", 9090};   // /metrics /healthz /readyz /v1/config /v1/keys
  std::optional<ListenerTls> tls;      // HTTPS on `listen`
  int threads = 0;                     // 0: one per CPU sluice may run on (Loops)
  int64_t max_connections = 10'000;    // beyond: new connections are closed at once
  int64_t max_header_bytes = 16 * 1024;
  int64_t max_body_bytes = 1024 * 1024;
  Duration read_timeout = Duration::Seconds(10);  // to receive one whole request
  Duration idle_timeout = Duration::Seconds(60);  // keep-alive wait between requests
  Duration upstream_timeout = Duration::Seconds(30);
  Duration drain_timeout = Duration::Seconds(10);  // SIGTERM: in-flight requests finish within
  bool access_log = false;
  bool legacy_headers = false;  // X-RateLimit-Limit/Remaining/Reset
  // Each thread on a CPU of its own, answering the connections whose
  // client sends from that CPU, when there is a thread for each CPU sluice
  // may run on.
  bool cpu_affinity = false;
  // Whether the gateway forwards request fields whose names hold '_'
  // (NGINX's directive of the same name; off there too). CGI, WSGI, Rack
  // and PHP servers read `X_Api_Key` as `X-Api-Key`, so a client could
  // send a field by a name no policy or proxy reads and have the upstream
  // take it for one they do. Forwarded or not, `X_Forwarded_For` and
  // `Sluice_Shadow_Denied` never go (they can only be a client's forgery),
  // and a key header counts as sent twice when it comes under both
  // spellings.
  bool underscores_in_headers = false;
  DecisionConfig decision;
  // The server's loops, and the gRPC listener's completion queues: `threads`,
  // or with 0 one per CPU this process may run on (its affinity).
  int Loops() const;
  friend bool operator==(const ServerConfig&, const ServerConfig&) = default;
};

struct StoreConfig {
  // The memory store: local limits (and on_store_error: local fallbacks).
  int64_t max_keys = 1'000'000;
  OnFull on_full = OnFull::kRemember;
  // The shared store for global limits, when configured.
  std::optional<RedisStoreOptions> redis;
  friend bool operator==(const StoreConfig&, const StoreConfig&) = default;
};

struct MatchConfig {
  std::optional<std::string> path_prefix;
  std::optional<std::string> path;    // exact
  std::optional<std::string> method;  // upper case, e.g. "POST"
  std::optional<std::string> host;    // compared case-insensitively, port ignored
  std::vector<std::string> headers;   // header names that must be present (lower case)
  friend bool operator==(const MatchConfig&, const MatchConfig&) = default;
};

// routes[].min_upload_rate when a route does not say (bytes a second).
inline constexpr int64_t kDefaultMinUploadRate = 1024;

struct RouteConfig {
  std::string name;
  MatchConfig match;
  HostPort upstream;  // from "http://host:port" or "https://host:port"
  // https://: TLS to the upstream, its certificate verified: the chain
  // against upstream_ca_file (empty: the system's authorities), the name
  // against the URL's host.
  bool upstream_tls = false;
  std::string upstream_ca_file;
  // The name the upstream's certificate must carry (and the SNI sent);
  // empty: the URL's host.
  std::string upstream_server_name;
  // A certificate (and its key) sluice presents to the upstream: mutual TLS
  // to it. Both or neither.
  std::string upstream_cert_file;
  std::string upstream_key_file;
  // host_header: upstream: the request goes with the upstream's own name as
  // Host (NGINX proxy_pass's default), not the client's.
  bool upstream_host = false;
  // A WebSocket handshake (GET with Upgrade: websocket) is passed to the
  // upstream, and once it answers 101 the connection is a tunnel between
  // the client and the upstream. Otherwise Upgrade is dropped, as every
  // hop-by-hop field.
  bool websocket = false;
  // The upstream's time to answer on this route (and for each read of a
  // body streamed as it comes), in place of server.upstream_timeout; zero:
  // server.upstream_timeout.
  Duration upstream_timeout;
  // How long a WebSocket tunnel on this route may stay quiet both ways
  // before it is closed, in place of server.idle_timeout (websocket routes
  // only); zero: server.idle_timeout.
  Duration idle_timeout;
  // The largest request body this route takes, in place of
  // server.max_body_bytes (which bounds what is read whole): a body that
  // is chunked or said to be over 1 MiB goes to the upstream as it comes.
  std::optional<int64_t> max_body_bytes;
  // Where bodies stream (max_body_bytes above server.max_body_bytes): the
  // least an upload's client must send on average, in bytes a second, over
  // the time it was waited for, after a grace of server.read_timeout; 0: no
  // floor.
  // Unset: kDefaultMinUploadRate.
  std::optional<int64_t> min_upload_rate;

  // Whether its large bodies stream: a bound above `server_max_body_bytes`
  // (server.max_body_bytes, which bounds what is read whole).
  bool StreamsUploads(int64_t server_max_body_bytes) const {
    return max_body_bytes.value_or(0) > server_max_body_bytes;
  }
  // min_upload_rate in force.
  int64_t MinUploadRate() const { return min_upload_rate.value_or(kDefaultMinUploadRate); }

  friend bool operator==(const RouteConfig&, const RouteConfig&) = default;
};

struct KeyPart {
  // kClientCert: the subject of the client's certificate, verified by a
  // listener's client_ca_file (RFC 2253, as NGINX's $ssl_client_s_dn).
  enum class Kind { kClientIp, kHeader, kPath, kRoute, kGlobal, kClientCert };
  Kind kind = Kind::kGlobal;
  std::string header;  // kHeader: the header name, lower case
  friend bool operator==(const KeyPart&, const KeyPart&) = default;
};

enum class Scope { kLocal, kGlobal };

struct LimitSpec {
  LimitOptions options;
  Scope scope = Scope::kLocal;
  // `lease:` (global fixed_window limits): decided on slices of the limit
  // in this process (docs/distributed.md, "Leased limits").
  std::optional<LeaseOptions> lease;
  friend bool operator==(const LimitSpec&, const LimitSpec&) = default;
};

// The jitter added to a Retry-After when none is configured: a tenth of the
// denying limit's period (the HTTP policies, Envoy's rules, the simulator).
inline Duration DefaultRetryAfterJitter(Duration period) {
  return Duration::Micros(period.micros() / 10);
}

struct DenyConfig {
  int status = 429;
  // Uniform jitter added on top of the exact Retry-After. Unset:
  // DefaultRetryAfterJitter of the denying limit's period.
  std::optional<Duration> retry_after_jitter;
  friend bool operator==(const DenyConfig&, const DenyConfig&) = default;
};

enum class MissingKey { kDeny, kClientIp };

// client_ip_prefix: how many leading bits of a client's address the
// `client_ip` key part counts it by. An IPv6 client is usually given a whole
// /64 (a home line, a phone, a cloud VM) and may send each request from
// another address in it; counted by its /64 it is one client, as an IPv4
// client behind one address is. At a full length (32, 128) a client is its
// address.
struct ClientIpPrefix {
  int ipv4 = 32;  // 1 to 32
  int ipv6 = 64;  // 1 to 128
  friend bool operator==(const ClientIpPrefix&, const ClientIpPrefix&) = default;
};
// The name this header used for what the limiter calls OnStoreError.
using StoreErrorMode [[deprecated("use sluice::OnStoreError")]] = OnStoreError;

// `cost: {estimate: N, settle: "response_header:NAME"}`: what a gateway
// request reserves, and where its true cost is read when the upstream has
// answered (docs/settled-costs.md).
struct CostConfig {
  int64_t estimate = 1;
  std::string response_header;  // empty: the estimate is the cost
  friend bool operator==(const CostConfig&, const CostConfig&) = default;
};

struct PolicyConfig {
  std::string name;
  std::optional<MatchConfig> match;  // absent: the gateway never applies it
  std::vector<KeyPart> key;          // default: [client_ip]
  MissingKey on_missing_key = MissingKey::kDeny;
  // The top-level client_ip_prefix, unless the policy sets its own.
  ClientIpPrefix client_ip_prefix;
  std::vector<LimitSpec> limits;
  bool shadow = false;
  DenyConfig on_deny;
  OnStoreError on_store_error = OnStoreError::kAllow;
  // A key over 1024 bytes (a long header value, say): decided under its
  // SHA-256, or refused with 400. Never an error a store failure mode decides.
  LongKeys long_keys = LongKeys::kHash;
  // What a gateway or auth_request request costs (default 1), settled from
  // the upstream's answer when `response_header` is set.
  CostConfig cost;
  friend bool operator==(const PolicyConfig&, const PolicyConfig&) = default;
};

// grpc: the Envoy rate limit service (RLS v3) listener. Every connection
// holds a file descriptor, shared with the HTTP and admin listeners, so
// their number and lifetime are bounded. All of it takes effect at start.
struct GrpcConfig {
  HostPort listen{"127.0.0.1", 8081};
  // Open connections, those still waiting for their first bytes included;
  // beyond, new ones are closed at once. 1 to kMaxGrpcConnections.
  int64_t max_connections = 1'000;
  // A connection that sends nothing within this is closed.
  Duration handshake_timeout = Duration::Seconds(10);
  // A connection with no call in progress for this long is closed.
  Duration idle_timeout = Duration::Minutes(5);
  // A connection is told to go away after this long (give or take 10%);
  // calls in progress then have max_connection_age_grace to finish.
  Duration max_connection_age = Duration::Hours(1);
  Duration max_connection_age_grace = Duration::Seconds(10);
  // gRPC over TLS (HTTP/2 chosen by ALPN), mutual with client_ca_file.
  std::optional<ListenerTls> tls;
  friend bool operator==(const GrpcConfig&, const GrpcConfig&) = default;
};
inline constexpr int64_t kMaxGrpcConnections = 1'000'000;

// rlqs: Envoy's rate limit quota service (RLQS) on grpc.listen: the
// buckets Envoys report, each bucket's limit split among the Envoys asking
// for it (docs/envoy.md, "Quota service").
struct RlqsLimitConfig {
  Rate rate;
  int64_t burst = 0;  // 0: the rate's limit
  // The strategy pushed to Envoy: a token bucket (default), or requests per
  // time unit.
  bool requests_per_time_unit = false;
  friend bool operator==(const RlqsLimitConfig&, const RlqsLimitConfig&) = default;
};
struct RlqsBucketConfig {
  // The bucket_id entries a bucket must have, with these values ("*": any
  // value, each its own bucket); other entries may be there too.
  std::vector<std::pair<std::string, std::string>> match;
  RlqsLimitConfig limit;
  friend bool operator==(const RlqsBucketConfig&, const RlqsBucketConfig&) = default;
};
enum class RlqsUnknown { kDenyAll, kAllowAll, kLimit };
struct RlqsDomainConfig {
  std::string domain;
  std::vector<RlqsBucketConfig> buckets;        // the first that matches
  RlqsUnknown unknown = RlqsUnknown::kDenyAll;  // buckets no entry matches
  RlqsLimitConfig unknown_limit;                // RlqsUnknown::kLimit
  friend bool operator==(const RlqsDomainConfig&, const RlqsDomainConfig&) = default;
};
struct RlqsConfig {
  Duration assignment_ttl = Duration::Seconds(10);
  Duration abandon_after = Duration::Seconds(60);
  int64_t max_buckets_per_stream = 1'000;
  std::vector<RlqsDomainConfig> domains;
  friend bool operator==(const RlqsConfig&, const RlqsConfig&) = default;
};

struct EnvoyConfig;  // sluice/envoy_config.h

struct Config {
  std::string source;  // the file it was read from ("<string>" for text)
  ServerConfig server;
  StoreConfig store;
  std::vector<Cidr> trusted_proxies;
  // The one header client_ip believes when the peer is a trusted proxy
  // (lower case): its addresses are read from the right, skipping trusted
  // hops. "forwarded" is read as RFC 7239 (for=); any other header as a
  // comma-separated list (X-Real-IP is a list of one).
  std::string real_ip_header = "x-forwarded-for";
  // Every policy's, unless it sets its own (PolicyConfig::client_ip_prefix).
  ClientIpPrefix client_ip_prefix;
  std::vector<RouteConfig> routes;
  std::vector<PolicyConfig> policies;
  std::optional<GrpcConfig> grpc;  // absent: no gRPC listener
  std::optional<RlqsConfig> rlqs;  // needs grpc
  // envoy: and envoy_files: (rules in envoyproxy/ratelimit's format, see
  // sluice/envoy_config.h); null when neither is set.
  std::shared_ptr<const EnvoyConfig> envoy;
};

struct ConfigLoadOptions {
  // An empty file (or one holding only comments) is a config that limits
  // nothing. A reload refuses it: an editor rewriting the file can leave it
  // empty for a moment, and taking that would forget every key's state.
  bool allow_empty = true;
};

absl::StatusOr<Config> LoadConfigFile(const std::string& path, ConfigLoadOptions options = {});
// `source` names the text in errors.
absl::StatusOr<Config> ParseConfig(std::string_view yaml, const std::string& source,
                                   ConfigLoadOptions options = {});

// What a valid config holds and sluice reads without acting on it, one line
// each ("file:line: path: ignored: why"): `sluice serve --check` prints
// them, and the server logs them at start and on every reload.
std::vector<std::string> ConfigWarnings(const Config& config);

}  // namespace sluice

#endif  // SLUICE_CONFIG_H_
