// The YAML config loader: yaml-cpp builds the node tree, this file walks it
// against the schema in docs/configuration.md.
//
// Every error is "<source>:<line>: <path>: <message>", the first one found.
// The line of a value is its own line, except that an empty value (`key:`)
// takes the key's line: yaml-cpp marks an implicit null where the next token
// starts, often a line further down. Absent optional keys leave the default
// that the struct in sluice/config.h already holds, which is why the field
// readers below write into a reference instead of returning a value.
//
// One file, longer than the usual 300 lines, because it is one schema read
// top to bottom; splitting it by section would scatter the shared readers.
#include "sluice/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <initializer_list>
#include <map>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "base/cat.h"
#include "config/envoy_yaml.h"
#include "config/yaml_text.h"
#include "sluice/rate.h"

#define SLUICE_RETURN_IF_ERROR(expr)                                  \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (0)

namespace sluice {
namespace {

using internal::Cat;

constexpr size_t kMaxNameLength = 128;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

using Value = internal::YamlAt;
using internal::DescribeNode;
using internal::JoinPath;
using internal::LineOf;

std::string ListOf(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view name : names) out += Cat(out.empty() ? "" : ", ", name);
  return out;
}

// RFC 9110 token characters: what header names and methods are made of.
bool IsToken(std::string_view s) {
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || kExtra.find(c) != std::string_view::npos;
  });
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

class Parser {
 public:
  Parser(std::string source, ConfigLoadOptions options)
      : source_(std::move(source)), options_(options) {}

  absl::Status Fail(const Value& at, std::string_view message) const {
    if (at.path.empty()) {
      return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", message));
    }
    return absl::InvalidArgumentError(Cat(source_, ":", at.line, ": ", at.path, ": ", message));
  }

  // An error from a lower layer (ParseRate, MakeLimit, ...) placed at `at`.
  absl::Status Fail(const Value& at, const absl::Status& status) const {
    return Fail(at, std::string_view(status.message().data(), status.message().size()));
  }

  absl::StatusOr<Config> Run(std::string_view yaml);

 private:
  // The entries of one map, checked against the keys the schema allows.
  class Fields {
   public:
    const Value* Find(std::string_view key) const {
      const Entry* entry = FindEntry(key);
      return entry == nullptr ? nullptr : &entry->value;
    }
    // Where a missing required key would have been.
    Value Missing(std::string_view key) const {
      return {YAML::Node(), JoinPath(self_.path, key), self_.line};
    }

   private:
    friend class Parser;
    struct Entry {
      std::string name;
      int key_line;
      Value value;
    };
    const Entry* FindEntry(std::string_view key) const {
      for (const Entry& entry : entries_) {
        if (entry.name == key) return &entry;
      }
      return nullptr;
    }
    Value self_;
    std::vector<Entry> entries_;
  };

  struct Unsupported {
    std::string_view key;
    std::string_view note;
  };

  absl::StatusOr<Fields> ReadMap(const Value& v, std::initializer_list<std::string_view> allowed,
                                 std::initializer_list<Unsupported> unsupported = {}) const;
  absl::StatusOr<std::vector<Value>> ReadList(const Value& v, std::string_view items) const;
  absl::StatusOr<std::string> ReadScalar(const Value& v, std::string_view expected) const;

  absl::Status ReadInt(const Value& v, int64_t min, int64_t max, int64_t& out) const;
  absl::Status ReadDuration(const Value& v, bool positive, Duration& out) const;
  absl::Status ReadBool(const Value& v, bool& out) const;
  absl::Status ReadChoice(const Value& v, std::initializer_list<std::string_view> choices,
                          size_t& out) const;
  absl::Status ReadName(const Value& v, std::string& out) const;
  absl::Status ReadHostPort(const Value& v, HostPort& out) const;

  absl::Status ReadServer(const Value& v, ServerConfig& out) const;
  absl::Status ReadDecision(const Value& v, DecisionConfig& out) const;
  absl::Status ReadTimeout(const Value& v, Duration& out) const;
  absl::Status ReadStore(const Value& v, StoreConfig& out) const;
  absl::Status ReadTrustedProxies(const Value& v, std::vector<Cidr>& out) const;
  absl::Status ReadMatch(const Value& v, MatchConfig& out) const;
  absl::Status ReadUpstream(const Value& v, HostPort& out) const;
  absl::Status ReadRoute(const Value& v, std::map<std::string, int>& names, RouteConfig& out) const;
  absl::Status ReadKey(const Value& v, std::vector<KeyPart>& out) const;
  absl::Status ReadLimit(const Value& v, LimitSpec& out) const;
  absl::Status ReadDeny(const Value& v, DenyConfig& out) const;
  absl::Status ReadPolicy(const Value& v, std::map<std::string, int>& names,
                          PolicyConfig& out) const;
  // Names are unique within their list; `names` maps each name seen to its line.
  absl::Status ReadUniqueName(const Value& v, std::string_view what,
                              std::map<std::string, int>& names, std::string& out) const;

  std::string source_;
  ConfigLoadOptions options_;
  bool shared_store_ = false;  // store.redis is configured: limits default to global
};

absl::StatusOr<Parser::Fields> Parser::ReadMap(
    const Value& v, std::initializer_list<std::string_view> allowed,
    std::initializer_list<Unsupported> unsupported) const {
  Fields fields;
  fields.self_ = v;
  if (v.node.IsNull()) return fields;  // `server:` with nothing under it: all defaults
  if (!v.node.IsMap()) return Fail(v, Cat("expected a map of keys, got ", DescribeNode(v.node)));
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    const YAML::Node key = it->first;
    const int key_line = LineOf(key, v.line);
    if (!key.IsScalar()) {
      return Fail({key, v.path, key_line}, Cat("expected a key name, got ", DescribeNode(key)));
    }
    const std::string name = key.Scalar();
    const std::string path = JoinPath(v.path, name);
    if (const Fields::Entry* first = fields.FindEntry(name)) {
      return Fail({key, path, key_line},
                  Cat("duplicate key (first at line ", first->key_line, ")"));
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      for (const Unsupported& u : unsupported) {
        if (u.key == name) {
          return Fail({key, path, key_line}, Cat("not supported by this version", u.note));
        }
      }
      return Fail({key, path, key_line},
                  Cat("unknown key (expected one of: ", ListOf(allowed), ")"));
    }
    const YAML::Node value = it->second;
    const int line = value.IsNull() ? key_line : LineOf(value, key_line);
    fields.entries_.push_back({name, key_line, Value{value, path, line}});
  }
  return fields;
}

absl::StatusOr<std::vector<Value>> Parser::ReadList(const Value& v, std::string_view items) const {
  std::vector<Value> out;
  if (v.node.IsNull()) return out;
  if (v.node.IsScalar()) {
    return Fail(v, Cat("expected a list of ", items, ", got ", DescribeNode(v.node), " (write [",
                       v.node.Scalar(), "])"));
  }
  if (!v.node.IsSequence()) return Fail(v, Cat("expected a list of ", items, ", got a map"));
  for (size_t i = 0; i < v.node.size(); ++i) {
    const YAML::Node item = v.node[i];
    out.push_back({item, Cat(v.path, "[", i, "]"), LineOf(item, v.line)});
  }
  return out;
}

absl::StatusOr<std::string> Parser::ReadScalar(const Value& v, std::string_view expected) const {
  if (!v.node.IsScalar()) return Fail(v, Cat("expected ", expected, ", got ", DescribeNode(v.node)));
  return v.node.Scalar();
}

absl::Status Parser::ReadInt(const Value& v, int64_t min, int64_t max, int64_t& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "an integer");
  if (!text.ok()) return text.status();
  const char* begin = text->data();
  const char* end = begin + text->size();
  int64_t value = 0;
  const auto [stop, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range && stop == end) {
    return Fail(v, Cat("\"", *text, "\" is too large"));
  }
  if (ec != std::errc() || stop != end) {
    return Fail(v, Cat("expected an integer, got \"", *text, "\""));
  }
  if (value < min || value > max) {
    if (max == kInt64Max) return Fail(v, Cat("must be at least ", min, ", got ", value));
    return Fail(v, Cat("must be from ", min, " to ", max, ", got ", value));
  }
  out = value;
  return absl::OkStatus();
}

absl::Status Parser::ReadDuration(const Value& v, bool positive, Duration& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "a duration such as 250ms or 10s");
  if (!text.ok()) return text.status();
  absl::StatusOr<Duration> d = ParseDuration(*text);
  if (!d.ok()) return Fail(v, d.status());
  if (positive && *d <= Duration::Zero()) return Fail(v, Cat("must be longer than 0, got ", *text));
  out = *d;
  return absl::OkStatus();
}

absl::Status Parser::ReadTimeout(const Value& v, Duration& out) const {
  SLUICE_RETURN_IF_ERROR(ReadDuration(v, true, out));
  if (out > kMaxTimeout) {
    return Fail(v, Cat("must be at most ", FormatDuration(kMaxTimeout), ", got ",
                       FormatDuration(out)));
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadBool(const Value& v, bool& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "true or false");
  if (!text.ok()) return text.status();
  // yaml-cpp's reading: true/false, yes/no, on/off, y/n, in three casings.
  if (!YAML::convert<bool>::decode(v.node, out)) {
    return Fail(v, Cat("expected true or false, got \"", *text, "\""));
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadChoice(const Value& v, std::initializer_list<std::string_view> choices,
                                size_t& out) const {
  const std::string expected = Cat("one of: ", ListOf(choices));
  absl::StatusOr<std::string> text = ReadScalar(v, expected);
  if (!text.ok()) return text.status();
  const auto it = std::find(choices.begin(), choices.end(), *text);
  if (it == choices.end()) return Fail(v, Cat("expected ", expected, "; got \"", *text, "\""));
  out = static_cast<size_t>(it - choices.begin());
  return absl::OkStatus();
}

absl::Status Parser::ReadName(const Value& v, std::string& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "a name");
  if (!text.ok()) return text.status();
  const bool valid = !text->empty() && std::all_of(text->begin(), text->end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
  if (!valid) {
    return Fail(v, Cat("name \"", *text, "\" may hold only letters, digits, '_', '.' and '-'"));
  }
  if (text->size() > kMaxNameLength) {
    return Fail(v, Cat("name is ", text->size(), " characters long, the most is ", kMaxNameLength));
  }
  out = *text;
  return absl::OkStatus();
}

absl::Status Parser::ReadHostPort(const Value& v, HostPort& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "HOST:PORT such as 127.0.0.1:8080");
  if (!text.ok()) return text.status();
  absl::StatusOr<HostPort> hp = ParseHostPort(*text);
  if (!hp.ok()) return Fail(v, hp.status());
  out = *hp;
  return absl::OkStatus();
}

absl::Status Parser::ReadServer(const Value& v, ServerConfig& out) const {
  absl::StatusOr<Fields> f =
      ReadMap(v, {"listen", "admin", "threads", "max_connections", "max_header_bytes",
                  "max_body_bytes", "read_timeout", "idle_timeout", "upstream_timeout",
                  "drain_timeout", "access_log", "legacy_headers", "decision"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("listen")) SLUICE_RETURN_IF_ERROR(ReadHostPort(*x, out.listen));
  if (const Value* x = f->Find("admin")) SLUICE_RETURN_IF_ERROR(ReadHostPort(*x, out.admin));
  if (const Value* x = f->Find("threads")) {
    int64_t threads = 0;
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 0, 256, threads));
    out.threads = static_cast<int>(threads);
  }
  if (const Value* x = f->Find("max_connections")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 1, kInt64Max, out.max_connections));
  }
  if (const Value* x = f->Find("max_header_bytes")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 1024, 1024 * 1024, out.max_header_bytes));
  }
  if (const Value* x = f->Find("max_body_bytes")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 0, 64 * 1024 * 1024, out.max_body_bytes));
  }
  const std::pair<std::string_view, Duration*> timeouts[] = {
      {"read_timeout", &out.read_timeout},
      {"idle_timeout", &out.idle_timeout},
      {"upstream_timeout", &out.upstream_timeout},
      {"drain_timeout", &out.drain_timeout},
  };
  for (const auto& [key, field] : timeouts) {
    if (const Value* x = f->Find(key)) SLUICE_RETURN_IF_ERROR(ReadTimeout(*x, *field));
  }
  if (const Value* x = f->Find("decision")) SLUICE_RETURN_IF_ERROR(ReadDecision(*x, out.decision));
  if (const Value* x = f->Find("access_log")) SLUICE_RETURN_IF_ERROR(ReadBool(*x, out.access_log));
  if (const Value* x = f->Find("legacy_headers")) {
    SLUICE_RETURN_IF_ERROR(ReadBool(*x, out.legacy_headers));
  }
  // Port 0 asks the OS for a free port, so two zeros do not collide.
  if (out.listen == out.admin && out.listen.port != 0) {
    const bool admin_given = f->Find("admin") != nullptr;
    const Value* at = admin_given ? f->Find("admin") : f->Find("listen");
    if (at == nullptr) at = &f->self_;  // cannot happen: the defaults differ
    const bool v6 = out.admin.host.find(':') != std::string::npos;
    return Fail(
        *at, Cat("same address as server.", admin_given ? "listen" : "admin", " (", v6 ? "[" : "",
                 out.admin.host, v6 ? "]" : "", ":", static_cast<int>(out.admin.port),
                 "); the admin listener needs an address of its own"));
  }
  if (const std::optional<HostPort>& d = out.decision.listen; d && d->port != 0) {
    if (*d == out.listen || *d == out.admin) {
      Value at = f->self_;
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
                                          kMaxTokenLength, " characters long, got ",
                                          token.size()));
  }
  if (!std::all_of(token.begin(), token.end(),
                   [](char c) { return c > ' ' && c < 0x7f && c != ','; })) {
    return absl::InvalidArgumentError(
        "a token may hold only visible ASCII characters, no spaces or commas");
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadDecision(const Value& v, DecisionConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, {"listen", "on_gateway_listener", "tokens", "token_env"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("listen")) {
    SLUICE_RETURN_IF_ERROR(ReadHostPort(*x, out.listen.emplace()));
  }
  if (const Value* x = f->Find("on_gateway_listener")) {
    SLUICE_RETURN_IF_ERROR(ReadBool(*x, out.on_gateway_listener));
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
  return absl::OkStatus();
}

absl::Status Parser::ReadStore(const Value& v, StoreConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, {"memory", "redis"});
  if (!f.ok()) return f.status();
  if (const Value* memory = f->Find("memory")) {
    absl::StatusOr<Fields> m = ReadMap(*memory, {"max_keys"});
    if (!m.ok()) return m.status();
    if (const Value* x = m->Find("max_keys")) {
      SLUICE_RETURN_IF_ERROR(ReadInt(*x, 1, kInt64Max, out.max_keys));
    }
  }
  if (const Value* redis = f->Find("redis")) {
    absl::StatusOr<Fields> r =
        ReadMap(*redis, {"url", "cluster", "user", "password", "password_env", "database",
                         "timeout", "connect_timeout", "key_prefix"});
    if (!r.ok()) return r.status();
    RedisStoreOptions& o = out.redis.emplace();
    const Value* url = r->Find("url");
    const Value* cluster = r->Find("cluster");
    if ((url == nullptr) == (cluster == nullptr)) {
      return Fail(*redis, "give exactly one of url (one server) and cluster (a list of nodes)");
    }
    if (url != nullptr) {
      absl::StatusOr<std::string> text = ReadScalar(*url, "a URL such as redis://127.0.0.1:6379");
      if (!text.ok()) return text.status();
      absl::StatusOr<RedisUrl> parsed = ParseRedisUrl(*text);
      if (!parsed.ok()) return Fail(*url, parsed.status());
      o.url = *text;
    }
    if (cluster != nullptr) {
      absl::StatusOr<std::vector<Value>> nodes = ReadList(*cluster, "nodes (host:port)");
      if (!nodes.ok()) return nodes.status();
      if (nodes->empty()) return Fail(*cluster, "at least one node (host:port)");
      for (const Value& node : *nodes) {
        absl::StatusOr<std::string> text = ReadScalar(node, "a node such as 127.0.0.1:7000");
        if (!text.ok()) return text.status();
        absl::StatusOr<RedisUrl> parsed = ParseRedisUrl(Cat("redis://", *text));
        if (!parsed.ok() || !parsed->user.empty() || !parsed->password.empty() ||
            parsed->database != 0) {
          return Fail(node, Cat("\"", *text, "\": expected host:port"));
        }
        o.cluster.push_back(*text);
      }
    }
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
      if (r->Find("password") != nullptr) return Fail(*x, "give password or password_env, not both");
      absl::StatusOr<std::string> name = ReadScalar(*x, "an environment variable's name");
      if (!name.ok()) return name.status();
      const char* value = std::getenv(name->c_str());
      if (value == nullptr) return Fail(*x, Cat("the environment has no ", *name));
      o.password = value;
    }
    if (const Value* x = r->Find("database")) {
      if (cluster != nullptr) return Fail(*x, "a Redis Cluster has only database 0");
      int64_t db = 0;
      SLUICE_RETURN_IF_ERROR(ReadInt(*x, 0, 1'000'000, db));
      o.database = static_cast<int>(db);
    }
    if (const Value* x = r->Find("timeout")) SLUICE_RETURN_IF_ERROR(ReadTimeout(*x, o.timeout));
    if (const Value* x = r->Find("connect_timeout")) {
      SLUICE_RETURN_IF_ERROR(ReadTimeout(*x, o.connect_timeout));
    }
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadTrustedProxies(const Value& v, std::vector<Cidr>& out) const {
  absl::StatusOr<std::vector<Value>> items = ReadList(v, "addresses or networks");
  if (!items.ok()) return items.status();
  for (const Value& item : *items) {
    absl::StatusOr<std::string> text = ReadScalar(item, "an address or network such as 10.0.0.0/8");
    if (!text.ok()) return text.status();
    absl::StatusOr<Cidr> cidr = ParseCidr(*text);
    if (!cidr.ok()) return Fail(item, cidr.status());
    out.push_back(*cidr);
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadMatch(const Value& v, MatchConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, {"path_prefix", "path", "method", "host", "headers"});
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
    out.host = Lower(*host);
  }
  if (const Value* x = f->Find("headers")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "header names");
    if (!items.ok()) return items.status();
    for (const Value& item : *items) {
      absl::StatusOr<std::string> name = ReadScalar(item, "a header name");
      if (!name.ok()) return name.status();
      if (!IsToken(*name)) return Fail(item, Cat("\"", *name, "\" is not a header name"));
      out.headers.push_back(Lower(*name));
    }
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadUpstream(const Value& v, HostPort& out) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "a URL such as http://127.0.0.1:3000");
  if (!text.ok()) return text.status();
  const std::string lower = Lower(*text);
  if (lower.starts_with("https://")) {
    return Fail(v, "https upstreams are not supported by this version (only http://HOST:PORT)");
  }
  if (!lower.starts_with("http://")) {
    return Fail(v, Cat("expected http://HOST:PORT, got \"", *text, "\""));
  }
  const std::string_view rest = std::string_view(*text).substr(7);
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
      ParseHostPort(has_port ? std::string(authority) : Cat(authority, ":80"));
  if (!hp.ok()) return Fail(v, Cat("upstream \"", *text, "\": ", hp.status().message()));
  if (hp->port == 0) return Fail(v, Cat("upstream \"", *text, "\": port 0 cannot be connected to"));
  out = *hp;
  return absl::OkStatus();
}

absl::Status Parser::ReadRoute(const Value& v, std::map<std::string, int>& names,
                               RouteConfig& out) const {
  if (!v.node.IsMap()) {
    return Fail(
        v, Cat("expected a route (a map with name, match and upstream), got ", DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(v, {"name", "match", "upstream"});
  if (!f.ok()) return f.status();
  const Value* name = f->Find("name");
  if (name == nullptr) return Fail(f->Missing("name"), "required");
  SLUICE_RETURN_IF_ERROR(ReadUniqueName(*name, "route", names, out.name));
  if (const Value* x = f->Find("match")) SLUICE_RETURN_IF_ERROR(ReadMatch(*x, out.match));
  const Value* upstream = f->Find("upstream");
  if (upstream == nullptr) return Fail(f->Missing("upstream"), "required (http://HOST:PORT)");
  return ReadUpstream(*upstream, out.upstream);
}

absl::Status Parser::ReadKey(const Value& v, std::vector<KeyPart>& out) const {
  absl::StatusOr<std::vector<Value>> items = ReadList(v, "key parts");
  if (!items.ok()) return items.status();
  if (items->empty()) {
    return Fail(v, "must not be empty (leave key out for the default [client_ip])");
  }
  static constexpr std::string_view kExpected = "client_ip, header:NAME, path, route or global";
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
    } else if (text->starts_with("header:")) {
      part.kind = KeyPart::Kind::kHeader;
      const std::string header = text->substr(7);
      if (!IsToken(header)) {
        return Fail(item, Cat("\"", header, "\" in \"", *text, "\" is not a header name"));
      }
      part.header = Lower(header);
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

absl::Status Parser::ReadLimit(const Value& v, LimitSpec& out) const {
  if (!v.node.IsMap()) {
    return Fail(v, Cat("expected a limit (a map with algorithm and rate), got ", DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(
      v, {"algorithm", "rate", "limit", "period", "burst", "mode", "max_delay", "queue", "scope"});
  if (!f.ok()) return f.status();
  LimitOptions& options = out.options;

  const Value* algorithm = f->Find("algorithm");
  if (algorithm == nullptr) return Fail(f->Missing("algorithm"), "required");
  static constexpr std::string_view kAlgorithms =
      "token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, sliding_window";
  absl::StatusOr<std::string> name = ReadScalar(*algorithm, Cat("one of: ", kAlgorithms));
  if (!name.ok()) return name.status();
  const std::optional<Algorithm> a = AlgorithmFromName(*name);
  if (!a) {
    return Fail(*algorithm,
                Cat("unknown algorithm \"", *name, "\" (expected one of: ", kAlgorithms, ")"));
  }
  options.algorithm = *a;

  const Value* rate = f->Find("rate");
  const Value* limit = f->Find("limit");
  const Value* period = f->Find("period");
  if (rate != nullptr && (limit != nullptr || period != nullptr)) {
    return Fail(limit != nullptr ? *limit : *period, "set rate or limit + period, not both");
  }
  if (rate != nullptr) {
    absl::StatusOr<std::string> text = ReadScalar(*rate, "a rate such as 100/s or 10/5s");
    if (!text.ok()) return text.status();
    absl::StatusOr<Rate> r = ParseRate(*text);
    if (!r.ok()) return Fail(*rate, r.status());
    options.rate = *r;
  } else if (limit == nullptr && period == nullptr) {
    return Fail(f->Missing("rate"), "required (a rate such as 100/s, or limit + period)");
  } else if (period == nullptr) {
    return Fail(f->Missing("period"), "required with limit");
  } else if (limit == nullptr) {
    return Fail(f->Missing("limit"), "required with period");
  } else {
    SLUICE_RETURN_IF_ERROR(ReadInt(*limit, 1, kMaxLimit, options.rate.limit));
    SLUICE_RETURN_IF_ERROR(ReadDuration(*period, true, options.rate.period));
    if (absl::Status s = ValidateRate(options.rate); !s.ok()) return Fail(*period, s);
  }

  if (const Value* x = f->Find("burst")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 1, kInt64Max, options.burst));
  }
  if (const Value* x = f->Find("mode")) {
    if (options.algorithm != Algorithm::kLeakyBucket) {
      return Fail(*x, Cat("mode applies only to leaky_bucket, not ", *name));
    }
    size_t mode = 0;
    SLUICE_RETURN_IF_ERROR(ReadChoice(*x, {"police", "shape"}, mode));
    options.mode = mode == 0 ? LeakyMode::kPolice : LeakyMode::kShape;
  }
  if (const Value* x = f->Find("max_delay")) {
    SLUICE_RETURN_IF_ERROR(ReadDuration(*x, false, options.max_delay));
  }
  if (const Value* x = f->Find("queue")) {
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 0, kInt64Max, options.queue));
  }
  // The default: shared when a shared store is configured.
  out.scope = shared_store_ ? Scope::kGlobal : Scope::kLocal;
  if (const Value* x = f->Find("scope")) {
    size_t scope = 0;
    SLUICE_RETURN_IF_ERROR(ReadChoice(*x, {"local", "global"}, scope));
    if (scope == 1 && !shared_store_) {
      return Fail(*x, "global needs a shared store (store.redis), none is configured");
    }
    out.scope = scope == 1 ? Scope::kGlobal : Scope::kLocal;
  }
  absl::StatusOr<LimitConfig> made = MakeLimit(options);
  if (!made.ok()) return Fail(v, made.status());
  return absl::OkStatus();
}

absl::Status Parser::ReadDeny(const Value& v, DenyConfig& out) const {
  absl::StatusOr<Fields> f = ReadMap(v, {"status", "retry_after_jitter"});
  if (!f.ok()) return f.status();
  if (const Value* x = f->Find("status")) {
    int64_t status = 0;
    SLUICE_RETURN_IF_ERROR(ReadInt(*x, 400, 599, status));
    out.status = static_cast<int>(status);
  }
  if (const Value* x = f->Find("retry_after_jitter")) {
    Duration jitter;
    SLUICE_RETURN_IF_ERROR(ReadDuration(*x, false, jitter));
    out.retry_after_jitter = jitter;
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadPolicy(const Value& v, std::map<std::string, int>& names,
                                PolicyConfig& out) const {
  if (!v.node.IsMap()) {
    return Fail(v, Cat("expected a policy (a map with name and limits), got ", DescribeNode(v.node)));
  }
  absl::StatusOr<Fields> f = ReadMap(v, {"name", "match", "key", "on_missing_key", "limits",
                                         "shadow", "on_deny", "on_store_error", "long_keys"});
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
    size_t choice = 0;
    SLUICE_RETURN_IF_ERROR(ReadChoice(*x, {"deny", "client_ip"}, choice));
    out.on_missing_key = choice == 0 ? MissingKey::kDeny : MissingKey::kClientIp;
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
    LimitSpec spec;
    SLUICE_RETURN_IF_ERROR(ReadLimit((*items)[i], spec));
    const bool is_shape =
        spec.options.algorithm == Algorithm::kLeakyBucket && spec.options.mode == LeakyMode::kShape;
    if (is_shape && shape) {
      return Fail((*items)[i], Cat("at most one leaky_bucket shape limit per policy (limits[",
                                   *shape, "] is one already)"));
    }
    if (is_shape) shape = i;
    out.limits.push_back(spec);
  }

  if (const Value* x = f->Find("shadow")) SLUICE_RETURN_IF_ERROR(ReadBool(*x, out.shadow));
  if (const Value* x = f->Find("on_deny")) SLUICE_RETURN_IF_ERROR(ReadDeny(*x, out.on_deny));
  if (const Value* x = f->Find("on_store_error")) {
    size_t choice = 0;
    SLUICE_RETURN_IF_ERROR(ReadChoice(*x, {"allow", "deny", "local"}, choice));
    static constexpr StoreErrorMode kModes[] = {StoreErrorMode::kAllow, StoreErrorMode::kDeny,
                                                StoreErrorMode::kLocal};
    out.on_store_error = kModes[choice];
  }
  if (const Value* x = f->Find("long_keys")) {
    size_t choice = 0;
    SLUICE_RETURN_IF_ERROR(ReadChoice(*x, {"hash", "refuse"}, choice));
    out.long_keys = choice == 0 ? LongKeys::kHash : LongKeys::kRefuse;
  }
  return absl::OkStatus();
}

absl::Status Parser::ReadUniqueName(const Value& v, std::string_view what,
                                    std::map<std::string, int>& names, std::string& out) const {
  SLUICE_RETURN_IF_ERROR(ReadName(v, out));
  const auto [it, inserted] = names.emplace(out, v.line);
  if (!inserted) {
    return Fail(v, Cat("duplicate ", what, " name \"", out, "\" (first at line ", it->second, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> Parser::Run(std::string_view yaml) {
  std::vector<YAML::Node> documents;
  try {
    documents = internal::LoadAllDocuments(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        Cat(source_, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  Config config;
  config.source = source_;
  if (documents.size() > 1) {
    return Fail({documents[1], "", LineOf(documents[1], 1)},
                "a config file holds one YAML document; a second one starts here");
  }
  if (documents.empty()) {  // empty, or only comments: a server that limits nothing
    if (!options_.allow_empty) {
      return absl::InvalidArgumentError(
          Cat(source_, ": the file is empty (or holds only comments); the config in force stays "
                       "(an editor rewriting the file can leave it empty for a moment)"));
    }
    return config;
  }
  const Value root{documents[0], "", LineOf(documents[0], 1)};
  if (!root.node.IsNull() && !root.node.IsMap()) {
    return Fail(root, Cat("expected a map of top-level keys (server, store, trusted_proxies, "
                          "routes, policies), got ",
                          DescribeNode(root.node)));
  }
  absl::StatusOr<Fields> f =
      ReadMap(root, {"server", "store", "trusted_proxies", "real_ip_header", "routes", "policies",
                     "grpc", "envoy", "envoy_files"});
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
    config.real_ip_header = Lower(*name);
  }
  if (const Value* x = f->Find("routes")) {
    absl::StatusOr<std::vector<Value>> items = ReadList(*x, "routes");
    if (!items.ok()) return items.status();
    std::map<std::string, int> names;
    for (const Value& item : *items) {
      RouteConfig route;
      SLUICE_RETURN_IF_ERROR(ReadRoute(item, names, route));
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
      config.policies.push_back(std::move(policy));
    }
  }
  // grpc, envoy, envoy_files: the Envoy rate limit service (config/envoy_config.cc).
  if (const Value* x = f->Find("grpc")) {
    absl::StatusOr<Fields> g =
        ReadMap(*x, {"listen", "max_connections", "handshake_timeout", "idle_timeout",
                     "max_connection_age", "max_connection_age_grace"});
    if (!g.ok()) return g.status();
    GrpcConfig& grpc = config.grpc.emplace();
    if (const Value* listen = g->Find("listen")) {
      SLUICE_RETURN_IF_ERROR(ReadHostPort(*listen, grpc.listen));
      for (const HostPort& other :
           {config.server.listen, config.server.admin,
            config.server.decision.listen.value_or(HostPort{"", 0})}) {
        if (grpc.listen == other && other.port != 0) {
          return Fail(*listen,
                      "same address as server.listen, server.admin or server.decision.listen; "
                      "gRPC needs its own");
        }
      }
    }
    if (const Value* v = g->Find("max_connections")) {
      SLUICE_RETURN_IF_ERROR(ReadInt(*v, 1, kMaxGrpcConnections, grpc.max_connections));
    }
    const std::pair<std::string_view, Duration*> grpc_timeouts[] = {
        {"handshake_timeout", &grpc.handshake_timeout},
        {"idle_timeout", &grpc.idle_timeout},
        {"max_connection_age", &grpc.max_connection_age},
        {"max_connection_age_grace", &grpc.max_connection_age_grace},
    };
    for (const auto& [key, field] : grpc_timeouts) {
      if (const Value* v = g->Find(key)) SLUICE_RETURN_IF_ERROR(ReadTimeout(*v, *field));
    }
  }
  if (f->Find("envoy") != nullptr || f->Find("envoy_files") != nullptr) {
    auto at = [](const Value* v) {
      return v == nullptr ? std::nullopt
                          : std::optional<internal::YamlAt>({v->node, v->path, v->line});
    };
    absl::StatusOr<std::shared_ptr<const EnvoyConfig>> envoy = internal::ReadEnvoySection(
        source_, at(f->Find("envoy")), at(f->Find("envoy_files")), {.shared_store = shared_store_});
    if (!envoy.ok()) return envoy.status();
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

}  // namespace sluice
