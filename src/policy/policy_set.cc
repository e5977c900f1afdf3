#include "policy/policy_set.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "base/ascii.h"
#include "base/cat.h"
#include "policy/request_text.h"

namespace sluice::policy {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// An address as a hop names it: "192.0.2.60", "192.0.2.60:4711",
// "[2001:db8::1]:4711", "2001:db8::1", optionally in double quotes.
std::optional<std::array<uint8_t, 16>> HopAddress(std::string_view v) {
  v = Trim(v);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string_view rest = v.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return std::nullopt;
    v = v.substr(1, close - 1);
  } else if (const size_t colon = v.find(':');
             colon != std::string_view::npos && v.find(':', colon + 1) == std::string_view::npos) {
    v = v.substr(0, colon);  // v4:port
  }
  return ParseIp(v);
}

// The value of parameter `name` ("for", "host": lower case) of one
// Forwarded element (`for=192.0.2.60;proto=https`); empty when it has
// none, which no address or host parses as.
std::string_view ForwardedParam(std::string_view element, std::string_view name) {
  size_t pos = 0;
  while (pos < element.size()) {
    size_t end = element.find(';', pos);
    if (end == std::string_view::npos) end = element.size();
    const std::string_view pair = Trim(element.substr(pos, end - pos));
    if (pair.size() > name.size() + 1 && pair[name.size()] == '=' &&
        internal::AsciiEqualsIgnoreCase(pair.substr(0, name.size()), name)) {
      return pair.substr(name.size() + 1);
    }
    pos = end + 1;
  }
  return {};
}

std::string_view ForwardedFor(std::string_view element) { return ForwardedParam(element, "for"); }

// Splits a field value into its comma-separated elements, left to right;
// a comma inside a quoted string does not split.
template <typename Each>
void ForEachElement(std::string_view value, Each each) {
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i <= value.size(); ++i) {
    if (i == value.size() || (value[i] == ',' && !quoted)) {
      each(value.substr(start, i - start));
      start = i + 1;
    } else if (value[i] == '"') {
      quoted = !quoted;
    } else if (value[i] == '\\' && quoted) {
      ++i;
    }
  }
}

std::string FormatIp(const std::array<uint8_t, 16>& ip) {
  static constexpr std::array<uint8_t, 12> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::equal(kMapped.begin(), kMapped.end(), ip.begin())) {
    inet_ntop(AF_INET, ip.data() + 12, text, sizeof text);
  } else {
    inet_ntop(AF_INET6, ip.data(), text, sizeof text);
  }
  return text;
}

void AppendEscaped(std::string& out, std::string_view part, bool lower = false) {
  for (char c : part) {
    if (c == '|' || c == '\\') out.push_back('\\');
    out.push_back(lower ? absl::ascii_tolower(static_cast<unsigned char>(c)) : c);
  }
}

// Every line of the header `name`; `as_upstreams_read`: under any name a
// CGI-style server reads as `name` (RequestFacts::cgi_lines) too, as a
// policy reads it (a route goes by the name as sent).
std::vector<std::string_view> LinesAsRead(const RequestFacts& request, std::string_view name,
                                          bool as_upstreams_read = true) {
  if (as_upstreams_read && request.cgi_lines) return request.cgi_lines(name);
  if (request.header_lines) return request.header_lines(name);
  if (const std::optional<std::string_view> value = request.header(name)) return {*value};
  return {};
}

// A query parameter's name as PHP puts it in $_GET: leading spaces
// dropped, each ' ' and '.' made '_', and a '[' without a ']' after it
// made '_' too (`.method` and `rest.route` are PHP's `_method` and
// `rest_route`). nullopt for an array (`a[b]`), which is no text. `buffer`
// holds the name when it is not `name` itself.
std::optional<std::string_view> PhpParamName(std::string_view name, std::string& buffer) {
  if (!name.empty() && name.front() != ' ' && name.find_first_of(" .[") == std::string_view::npos) {
    return name;
  }
  buffer.assign(name.substr(std::min(name.size(), name.find_first_not_of(' '))));
  const size_t bracket = buffer.find('[');
  if (bracket != std::string::npos) {
    if (buffer.find(']', bracket) != std::string::npos) return std::nullopt;
    buffer[bracket] = '_';
  }
  std::replace(buffer.begin(), buffer.end(), ' ', '_');
  std::replace(buffer.begin(), buffer.end(), '.', '_');
  return buffer;
}

// `text` of a query decoded ('+' a space), in `buffer` when it is not
// `text` itself; nullopt for a bad escape.
std::optional<std::string_view> QueryText(std::string_view text, std::string& buffer) {
  if (text.find_first_of("%+") == std::string_view::npos) return text;
  buffer.assign(text);
  std::replace(buffer.begin(), buffer.end(), '+', ' ');
  std::optional<std::string> decoded = PercentDecode(buffer);
  if (!decoded) return std::nullopt;
  buffer = *std::move(decoded);
  return buffer;
}

// Calls `each(name, value)` for every parameter of `query` with a value,
// separated by '&' or ';' (Rack 2), both decoded ('+' a space) and the
// name as PHP reads it (PhpParamName); a name other servers read as it is
// only ever names less. Parameters with a bad escape are skipped.
template <typename Each>
void ForEachQueryParam(std::string_view query, Each&& each) {
  std::string name_buffer, mangled_buffer, value_buffer;
  for (std::string_view rest = query; !rest.empty();) {
    const size_t end = rest.find_first_of("&;");
    const std::string_view param = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    const size_t eq = param.find('=');
    if (eq == std::string_view::npos) continue;
    const std::optional<std::string_view> name = QueryText(param.substr(0, eq), name_buffer);
    if (!name) continue;
    const std::optional<std::string_view> php = PhpParamName(*name, mangled_buffer);
    const std::optional<std::string_view> value = QueryText(param.substr(eq + 1), value_buffer);
    if (php && value) each(*php, *value);
  }
}

// How many of a list's elements a policy reads from each end (EndsKept).
inline constexpr size_t kEndsKept = 8;

// The first and the last kEndsKept values of those added, in no
// particular order: what a policy reads of a list a client may make
// thousands of elements long, so that such a list costs each policy no
// more than a short one.
template <typename T>
class EndsKept {
 public:
  void Add(T value) {
    if (seen_ < kEndsKept) {
      kept_.push_back(std::move(value));
    } else {
      end_[(seen_ - kEndsKept) % kEndsKept] = std::move(value);
    }
    ++seen_;
  }
  absl::InlinedVector<T, 2> Take() && {
    const size_t after = seen_ > kEndsKept ? seen_ - kEndsKept : 0;
    for (size_t i = 0; i < std::min(after, kEndsKept); ++i) kept_.push_back(std::move(end_[i]));
    return std::move(kept_);
  }

 private:
  absl::InlinedVector<T, 2> kept_;  // the first kEndsKept
  std::array<T, kEndsKept> end_;    // the last ones after them, a ring
  size_t seen_ = 0;
};

// What a policy reads of a request besides its method, Host and path as
// sent, worked out at most once however many policies ask (a long path
// decoded once, not once a policy), and only when a policy asks: the
// paths an upstream may route it by (UpstreamPaths), the hosts it names
// (ForwardedHosts), the methods its query names (QueryMethods).
struct OtherReadings {
  std::optional<absl::InlinedVector<std::string, 2>> paths;
  std::optional<absl::InlinedVector<std::string_view, 2>> hosts;
  std::optional<absl::InlinedVector<std::string, 2>> methods;
};

// Whether `request` reaches an upstream as a `method` request (`method`
// upper case). Its method is compared without case: Django, Flask,
// Laravel and Symfony upper-case the method they are sent, so `post /login`
// is their POST. And a POST may name another method in an override field
// (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override, any line of
// them), in a `_method` query parameter, which Laravel, Symfony, Rack
// and Express's method-override act on, or in a `_method` field of its
// body (RequestFacts::body_methods: Rack, Laravel, Symfony): it is a
// request of that method as well. A HEAD runs the GET's
// handler in Express, Flask, Django, Rails and Spring (only the body is
// dropped), so it is a GET too. A policy so counts more requests than an
// upstream may act on, never fewer.
// `others`: where the query's methods are kept once read; null for a
// route, which reads them here and the override fields by their names as
// sent (LinesAsRead).
bool MethodMatches(std::string_view method, const RequestFacts& request, OtherReadings* others) {
  if (internal::AsciiEqualsIgnoreCase(request.method, method)) return true;
  if (method == "GET" && internal::AsciiEqualsIgnoreCase(request.method, "HEAD")) return true;
  if (!internal::AsciiEqualsIgnoreCase(request.method, "POST")) return false;
  for (std::string_view name : {"x-http-method-override", "x-http-method", "x-method-override"}) {
    for (std::string_view line : LinesAsRead(request, name, others != nullptr)) {
      if (internal::AsciiEqualsIgnoreCase(line, method)) return true;
    }
  }
  for (const std::string& named : request.body_methods) {
    if (internal::AsciiEqualsIgnoreCase(named, method)) return true;
  }
  if (request.query.empty()) return false;
  std::optional<absl::InlinedVector<std::string, 2>> read;
  std::optional<absl::InlinedVector<std::string, 2>>& methods = others ? others->methods : read;
  if (!methods) methods = QueryMethods(request.query);
  return std::any_of(methods->begin(), methods->end(), [&](const std::string& named) {
    return internal::AsciiEqualsIgnoreCase(named, method);
  });
}

// The hosts a request names besides Host: the elements of X-Forwarded-Host
// and the `host=` of Forwarded, on any line, without port or trailing dot.
// Rack (so Rails' host constraints) serves a request for its
// X-Forwarded-Host, and Express, Django, Symfony and Spring do when told
// to trust the proxy in front: a policy on one of these hosts counts the
// request too, more requests than an upstream may serve for it, never
// fewer. Upstreams read the first element (Express), the last (Rack) or one
// near the right end (Symfony, past its trusted proxies): the first and
// the last few are kept (EndsKept).
absl::InlinedVector<std::string_view, 2> ForwardedHosts(const RequestFacts& request) {
  EndsKept<std::string_view> hosts;
  for (std::string_view name : {"x-forwarded-host", "forwarded"}) {
    const auto each = [&](std::string_view element) {
      std::string_view v = Trim(name == "forwarded" ? ForwardedParam(element, "host") : element);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      if (!v.empty()) hosts.Add(HostName(v));
    };
    for (std::string_view line : LinesAsRead(request, name)) ForEachElement(line, each);
  }
  return std::move(hosts).Take();
}

// `path` without a trailing '/' (but "/").
std::string_view WithoutTrailingSlash(std::string_view path) {
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

// Whether the request's `path` is the policy's `exact` path as an upstream
// may route it: without case (Express and ASP.NET Core route `/LOGIN` to
// their `/login` by default, and IIS serves it), with or without a
// trailing '/' (Express and Rails route `/login/` to `/login`), and with a
// format suffix (Rails routes `/login.json` to `/login`, and Spring MVC
// before 5.3 `/login.do`).
bool PathMatches(std::string_view path, std::string_view exact) {
  path = WithoutTrailingSlash(path);
  exact = WithoutTrailingSlash(exact);
  if (path.size() < exact.size() ||
      !internal::AsciiEqualsIgnoreCase(path.substr(0, exact.size()), exact)) {
    return false;
  }
  const std::string_view rest = path.substr(exact.size());
  return rest.empty() ||
         (rest.front() == '.' && exact.back() != '/' && rest.find('/') == std::string_view::npos);
}

// `path` without a format suffix (PathMatches): its last segment up to
// its first '.' after a name (`/login.json` and `/login.a.b` are `/login`;
// `/.env` stays).
std::string_view WithoutFormatSuffix(std::string_view path) {
  const size_t slash = path.rfind('/');
  const size_t name = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', name);
  return dot == std::string_view::npos || dot == name ? path : path.substr(0, dot);
}

// Whether the request's `path` starts with the policy's `prefix`, without
// case; a prefix that ends with '/' also takes the path without it (an
// Express router mounted at `/admin/` serves `/admin`).
bool PrefixMatches(std::string_view path, std::string_view prefix) {
  return internal::AsciiEqualsIgnoreCase(path.substr(0, prefix.size()), prefix) ||
         (prefix.size() > 1 && prefix.back() == '/' &&
          internal::AsciiEqualsIgnoreCase(path, WithoutTrailingSlash(prefix)));
}

// Whether a path segment names a PHP script: a name, then `.php` in any
// case.
bool IsPhpScript(std::string_view segment) {
  return segment.size() > 4 &&
         internal::AsciiEqualsIgnoreCase(segment.substr(segment.size() - 4), ".php");
}

// Whether a path segment names a script its server runs for a longer path
// too, handing it the rest as PATH_INFO: a name, then (in any case) `.php`,
// `.php` and a digit, `.phtml` or `.phar` (what Debian's Apache hands PHP,
// and what hosts map to it), `.asp`, `.aspx`, `.asmx`, `.ashx` or `.svc`
// (IIS), `.cgi`, `.fcgi` or `.pl` (CGI).
bool IsPathInfoScript(std::string_view segment) {
  const size_t dot = segment.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  std::string_view ext = segment.substr(dot + 1);
  if (ext.size() == 4 && ext.back() >= '0' && ext.back() <= '9') ext.remove_suffix(1);  // php5
  for (std::string_view script :
       {"php", "phtml", "phar", "asp", "aspx", "asmx", "ashx", "svc", "cgi", "fcgi", "pl"}) {
    if (internal::AsciiEqualsIgnoreCase(ext, script)) return true;
  }
  return false;
}

// Where Apache with MultiViews finds a folder's index.php by its name,
// the rest its PATH_INFO (`/blog/index/login`): the offset of the first
// `index` segment that has more after it, unless a script comes first
// (IsPathInfoScript: it is what runs); npos where there is none.
constexpr std::string_view kNegotiatedIndex = "index";
size_t NegotiatedIndexAt(std::string_view path) {
  for (size_t start = 1; start < path.size();) {
    const size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) break;
    const std::string_view segment = path.substr(start, slash - start);
    if (IsPathInfoScript(segment)) break;
    if (internal::AsciiEqualsIgnoreCase(segment, kNegotiatedIndex)) return start;
    start = slash + 1;
  }
  return std::string_view::npos;
}

// `path` without a last segment that is a folder's index page
// (`/login/index.php` -> `/login/`): Apache and NGINX with PHP, Tomcat and
// IIS serve the folder with it (index.php, index.jsp, default.aspx,
// default.asp).
std::string_view WithoutDirectoryIndex(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return path;
  const std::string_view last = path.substr(slash + 1);
  // `index` too: Apache with MultiViews serves index.php for it.
  for (std::string_view index :
       {"index.php", "index.jsp", "default.aspx", "default.asp", "index"}) {
    if (internal::AsciiEqualsIgnoreCase(last, index)) return path.substr(0, slash + 1);
  }
  return path;
}

// Whether `path` and a policy's `exact` path name one folder, one of them
// by its index page: `/login/index.php` is `/login/`, and `/login/` is a
// policy's `/login/index.php`.
bool IndexMatches(std::string_view path, std::string_view exact) {
  const std::string_view folder = WithoutDirectoryIndex(path);
  const std::string_view exact_folder = WithoutDirectoryIndex(exact);
  if ((folder.size() != path.size() || exact_folder.size() != exact.size()) &&
      PathMatches(folder, exact_folder)) {
    return true;
  }
  // `/login/index/x`: Apache with MultiViews runs the folder's index.php
  // for it, the rest its PATH_INFO.
  const size_t index = NegotiatedIndexAt(path);
  return index != std::string_view::npos && PathMatches(path.substr(0, index), exact_folder);
}

// Whether `path` is the folder of a policy's `prefix` that ends with an
// index page (`/login/` for `/login/index.php`). A path with the index page
// in it already starts with its folder.
bool IndexPrefixMatches(std::string_view path, std::string_view prefix) {
  const std::string_view folder = WithoutDirectoryIndex(prefix);
  return folder.size() != prefix.size() &&
         internal::AsciiEqualsIgnoreCase(WithoutTrailingSlash(path), WithoutTrailingSlash(folder));
}

// Whether the request's `path` runs the script that is a policy's `exact`
// path (`/wp-login.php`, IsPathInfoScript) when the server finds a script
// by its name without the extension: Apache with MultiViews (where a
// handler's files are negotiated: `AddType application/x-httpd-php .php`,
// or `MultiviewsMatch Handlers`) runs `/wp-login.php` for `/wp-login` and,
// the rest its PATH_INFO, for `/wp-login/x`; so do the extensionless
// rewrites hosts write (mod_rewrite's `$1.php`, NGINX's `try_files`
// falling back to a `rewrite` to `$1.php`) for `/wp-login`. Where the
// server does neither, a policy so counts requests for a `/wp-login/`
// folder too: more than it must, never fewer.
bool NegotiatedScriptMatches(std::string_view path, std::string_view exact) {
  exact = WithoutTrailingSlash(exact);
  const size_t slash = exact.rfind('/');
  if (slash == std::string_view::npos || !IsPathInfoScript(exact.substr(slash + 1))) return false;
  const std::string_view stem = WithoutFormatSuffix(exact);
  return internal::AsciiEqualsIgnoreCase(path.substr(0, stem.size()), stem) &&
         (path.size() == stem.size() || path[stem.size()] == '/');
}

// A path split at its first segment that names a script (IsPathInfoScript,
// or any segment right after a `cgi-bin` one: Apache's ScriptAlias
// /cgi-bin/, which Debian's Apache sets up wherever CGI is on, runs every
// file there as a CGI script)
// and has more after it: `/blog/wp-login.php/x` is the folder `/blog`, the
// script `wp-login.php` and the rest `/x`. Apache (its AcceptPathInfo, on
// for PHP and CGI handlers), PHP-FPM behind NGINX's
// fastcgi_split_path_info, and IIS run that script, the rest its
// PATH_INFO. The first such segment: a file has no children, so no later
// one is reached.
struct ScriptSplit {
  std::string_view folder;  // "" at the root
  std::string_view script;
  std::string_view script_path;  // the folder, '/', the script
  std::string_view rest;         // from the '/' after the script
};
std::optional<ScriptSplit> SplitAtScript(std::string_view path) {
  std::string_view previous;
  for (size_t start = 1; start < path.size();) {
    const size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) break;
    const std::string_view segment = path.substr(start, slash - start);
    if (IsPathInfoScript(segment) ||
        (!segment.empty() && internal::AsciiEqualsIgnoreCase(previous, "cgi-bin"))) {
      return ScriptSplit{path.substr(0, start - 1), segment, path.substr(0, slash),
                         path.substr(slash)};
    }
    previous = segment;
    start = slash + 1;
  }
  return std::nullopt;
}

// The script a server runs for `path` (SplitAtScript): `/wp-login.php` for
// `/wp-login.php/x`. Any other path as it is.
std::string_view ScriptPath(std::string_view path) {
  const std::optional<ScriptSplit> split = SplitAtScript(path);
  return split ? split->script_path : path;
}

// The path a PHP front controller routes the request to, as it reads from
// outside: its folder, then its PATH_INFO. Laravel and Symfony (their
// Request's path info) route `/index.php/login` as `/login`, and,
// installed in `/blog`, `/blog/index.php/login` as their `/login`, which
// is `/blog/login`; `/index.php` is `/`. nullopt where no PHP script
// comes before the path's end (SplitAtScript) and for a path that is no
// script at the root. `split`: SplitAtScript(path). `named`: only a front
// controller by its usual name (index.php; app.php and app_dev.php,
// Symfony's before 4), not any script.
std::optional<std::string> FrontControllerPath(std::string_view path,
                                               const std::optional<ScriptSplit>& split,
                                               bool named = false) {
  const auto front_controller = [named](std::string_view script) {
    return IsPhpScript(script) && (!named || internal::AsciiEqualsIgnoreCase(script, "index.php") ||
                                   internal::AsciiEqualsIgnoreCase(script, "app.php") ||
                                   internal::AsciiEqualsIgnoreCase(script, "app_dev.php"));
  };
  if (path.size() > 1 && path.front() == '/' && path.find('/', 1) == std::string_view::npos) {
    if (front_controller(path.substr(1))) return "/";
    return std::nullopt;
  }
  if (!split || !front_controller(split->script)) return std::nullopt;
  return internal::Cat(split->folder, split->rest);
}

// The path a PHP front controller found by its name routes the request
// to: Apache with MultiViews runs `/blog/index.php` for
// `/blog/index/login` (FrontControllerPath: `/blog/login`); nullopt where
// no index.php is found so (NegotiatedIndexAt).
std::optional<std::string> NegotiatedFrontControllerPath(std::string_view path) {
  const size_t index = NegotiatedIndexAt(path);
  if (index == std::string_view::npos) return std::nullopt;
  return internal::Cat(path.substr(0, index - 1), path.substr(index + kNegotiatedIndex.size()));
}

// Basic credentials as the bytes they stand for, encoded again in the one
// standard spelling. Servers decode many spellings to the same bytes:
// lenient decoders (Python's, Node's, PHP's, Ruby's) skip characters
// outside the alphabet (`dXNl.cjpwYXNz`) and ignore the unused low bits of
// the last one; Node's stops at the first '=', Python's at one that
// completes a group.
// So are these: characters outside the alphabet are skipped ('-' and '_'
// too, which Node alone reads as '+' and '/'), and the first '=' ends the
// text. Otherwise a client could send one user's credentials under as many
// spellings as it likes, each a bucket of its own (what a spelling read
// otherwise leaves is a few buckets, not endless ones).
std::string BasicCredentialsKey(std::string_view text) {
  std::string bytes;
  uint32_t bits = 0;
  int count = 0;  // bits not yet taken into a byte
  for (const char c : text) {
    if (c == '=') break;
    int v = -1;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    if (c >= '0' && c <= '9') v = c - '0' + 52;
    if (c == '+') v = 62;
    if (c == '/') v = 63;
    if (v < 0) continue;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      bytes.push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return absl::Base64Escape(bytes);
}

// An Authorization (or Proxy-Authorization) value as the one credential
// it names: its scheme is case-insensitive (RFC 9110 section 11.1), and
// servers split the scheme from the credentials at any run of spaces or
// tabs (Django REST framework, Rack): `Bearer t`, `bearer t` and
// `BEARER \t t` are one bucket, written "bearer t". Otherwise a client
// could send one token under as many spellings as it likes, each a bucket
// of its own.
std::string CredentialsKey(std::string_view value) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  size_t i = 0;
  while (i < value.size() && !blank(value[i])) ++i;
  std::string out = internal::AsciiLower(value.substr(0, i));
  while (i < value.size() && blank(value[i])) ++i;
  if (i < value.size()) {
    out.push_back(' ');
    const std::string_view credentials = Trim(value.substr(i));
    out.append(out == "basic " ? BasicCredentialsKey(credentials) : std::string(credentials));
  }
  return out;
}

// The path with every escape decoded, `%2F` included, when that differs
// from `path` (normalized: escapes of unreserved characters are decoded
// already): what WSGI servers hand Django and Flask as PATH_INFO, and what
// Symfony's router matches, so `/login%2F` is their `/login/`. IIS's
// `%uNNNN` escapes too (a code point, in UTF-8): http.sys takes that
// notation by default (its PercentUAllowed), so `/%u006Cogin` is its
// `/login`. nullopt for a bad escape.
std::optional<std::string> DecodedPath(std::string_view path) {
  if (path.find('%') == std::string_view::npos) return std::nullopt;
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      out.push_back(path[i]);
      continue;
    }
    if (const std::optional<char> c = PercentByte(path, i)) {
      out.push_back(*c);
      i += 2;
      continue;
    }
    // "%uNNNN"
    const std::optional<uint32_t> unit =
        i + 5 < path.size() && (path[i + 1] == 'u' || path[i + 1] == 'U')
            ? HexValue(path.substr(i + 2, 4))
            : std::nullopt;
    if (!unit) return std::nullopt;
    const uint32_t code = *unit;
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
    i += 5;
  }
  return out;
}

// The folder an application serving `path` may be installed in: the path
// without a trailing '/' and a last segment ending in `.php` ("" for `/`
// and `/index.php`, "/blog" for `/blog/` and `/blog/index.php`).
std::string_view FolderOf(std::string_view path) {
  path = WithoutTrailingSlash(path);
  const size_t slash = path.rfind('/');
  if (slash != std::string_view::npos) {
    if (IsPhpScript(path.substr(slash + 1))) path = path.substr(0, slash);
  }
  return path == "/" ? std::string_view() : path;
}

// The paths PHP applications route a request by that its query names,
// for an application installed at the root or in the path's folder
// (FolderOf):
// - CodeIgniter 3 routes `/?/login` and `/index.php?/login` as `/login`
//   (a query that starts with '/', up to a '?');
// - Drupal 7 routes any request with a `q` as `/<q>`: `/?q=user/login`
//   is `/user/login`;
// - WordPress serves the REST route `rest_route` names on any path:
//   `/?rest_route=/wp/v2/users` is `/wp-json/wp/v2/users`.
// PHP keeps the last of a repeated parameter, so only the last is read.
// Where the application is another, a policy so counts more of the
// requests a client shaped so than it must, never fewer.
absl::InlinedVector<std::string, 2> QueryRoutedPaths(std::string_view path,
                                                     std::string_view query) {
  absl::InlinedVector<std::string, 2> out;
  if (query.empty()) return out;
  const std::string_view folder = FolderOf(path);
  if (query.front() == '/') out.push_back(internal::Cat(folder, query.substr(0, query.find('?'))));
  std::optional<std::string> q, rest_route;
  ForEachQueryParam(query, [&](std::string_view name, std::string_view value) {
    if (name == "q") q = std::string(value);
    if (name == "rest_route") rest_route = std::string(value);
  });
  // At the root, and in the folder when it is another.
  const auto both = [&](std::string_view page) {
    out.push_back(std::string(page));
    if (!folder.empty()) out.push_back(internal::Cat(folder, page));
  };
  if (q) {
    std::string_view page = *q;
    while (!page.empty() && page.front() == '/') page.remove_prefix(1);
    both(internal::Cat("/", page));
  }
  if (rest_route) {
    both(internal::Cat("/wp-json", rest_route->empty() || rest_route->front() != '/' ? "/" : "",
                       *rest_route));
  }
  return out;
}

// The paths an upstream may route the request by besides the path as
// sent: the paths its query names (QueryRoutedPaths); and of these and
// the path (and the path as NGINX reads the one sent, PlainPath), each
// decoded whole (DecodedPath), that decoded path
// normalized again (NGINX decodes every escape, `%2F` included, before it
// merges slashes and applies dot segments: `/%2Flogin` and
// `/x/..%2Flogin` are in its `location /login`), and each behind a PHP
// front controller (FrontControllerPath) and the script a server runs for
// it (ScriptPath: `/wp-login.php` for `/wp-login.php/x`), or found by
// its name (NegotiatedFrontControllerPath).
absl::InlinedVector<std::string, 2> UpstreamPaths(std::string_view path, std::string_view raw_path,
                                                  std::string_view query) {
  absl::InlinedVector<std::string, 2> out;
  const auto add = [&](std::string_view sent, bool as_sent) {
    const std::optional<std::string> decoded = DecodedPath(sent);
    std::optional<std::string> resolved;
    if (decoded) {
      if (std::string normal = NormalizePath(*decoded); normal != *decoded) {
        resolved = std::move(normal);
      }
    }
    for (const std::string_view p :
         {sent, decoded ? std::string_view(*decoded) : std::string_view(),
          resolved ? std::string_view(*resolved) : std::string_view()}) {
      if (p.empty()) continue;
      if (!as_sent || p.data() != sent.data()) out.emplace_back(p);
      const std::optional<ScriptSplit> split = SplitAtScript(p);
      if (std::optional<std::string> routed = FrontControllerPath(p, split)) {
        out.push_back(*std::move(routed));
      }
      if (std::optional<std::string> routed = NegotiatedFrontControllerPath(p)) {
        out.push_back(*std::move(routed));
      }
      if (split) out.emplace_back(split->script_path);
    }
  };
  add(path, /*as_sent=*/true);
  // NGINX keeps what NormalizePath reads as Tomcat and IIS do (a segment's
  // parameters, a backslash, sent as they are or escaped): "/login/..;/",
  // "/login\\..\\x" and "/%2Flogin%5C.." are in its `location /login`.
  if (raw_path.find_first_of(";\\%") != std::string_view::npos) {
    if (std::string plain = PlainPath(raw_path); plain != path) add(plain, /*as_sent=*/false);
  }
  for (const std::string& routed : QueryRoutedPaths(path, query)) {
    add(NormalizePath(routed), /*as_sent=*/false);
  }
  return out;
}

// Matches, with `others` (null: none) where a request also matches as an
// upstream may read it besides its Host and path: a host named in
// X-Forwarded-Host or Forwarded (ForwardedHosts), a path an upstream may
// route it by (UpstreamPaths). A policy's match reads it so; a route goes
// by Host and path alone.
bool MatchesAs(const MatchConfig& match, const RequestFacts& request, OtherReadings* others) {
  const bool as_upstreams_read = others != nullptr;
  const auto any_other = [&](auto&& matches) {
    if (!as_upstreams_read) return false;
    if (!others->paths)
      others->paths = UpstreamPaths(request.path, request.raw_path, request.query);
    return std::any_of(others->paths->begin(), others->paths->end(), matches);
  };
  const auto forwarded_host = [&](std::string_view host) {
    if (!as_upstreams_read) return false;
    if (!others->hosts) others->hosts = ForwardedHosts(request);
    return std::any_of(others->hosts->begin(), others->hosts->end(), [&](std::string_view h) {
      return internal::AsciiEqualsIgnoreCase(h, host);
    });
  };
  const auto path_matches = [&](std::string_view p) {
    return PathMatches(p, *match.path) ||
           (as_upstreams_read &&
            (IndexMatches(p, *match.path) || NegotiatedScriptMatches(p, *match.path)));
  };
  if (match.path && !path_matches(request.path) && !any_other(path_matches)) return false;
  const auto prefix_matches = [&](std::string_view p) {
    return PrefixMatches(p, *match.path_prefix) ||
           (as_upstreams_read && IndexPrefixMatches(p, *match.path_prefix));
  };
  if (match.path_prefix && !prefix_matches(request.path) && !any_other(prefix_matches)) {
    return false;
  }
  if (match.method && !MethodMatches(*match.method, request, others)) return false;
  if (match.host && request.host != *match.host && !forwarded_host(*match.host)) {
    return false;
  }
  for (const std::string& name : match.headers) {
    // For a policy, under any name an upstream reads as it (`X_Api_Key`).
    if (!request.header(name) && (!as_upstreams_read || LinesAsRead(request, name).empty())) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::InlinedVector<std::string, 2> QueryMethods(std::string_view query) {
  EndsKept<std::string> methods;
  ForEachQueryParam(query, [&](std::string_view name, std::string_view value) {
    if (name == "_method") methods.Add(std::string(value));
  });
  return std::move(methods).Take();
}

namespace {

// The parameter `name` (lower case) of a field value's `;`-separated
// parameters, unquoted (`boundary="a b"`, `name='x'`); nullopt when absent.
std::optional<std::string_view> FieldParam(std::string_view value, std::string_view name) {
  for (size_t semicolon = value.find(';'); semicolon != std::string_view::npos;) {
    const size_t next = value.find(';', semicolon + 1);
    const std::string_view param = value.substr(semicolon + 1, next - semicolon - 1);
    semicolon = next;
    const size_t eq = param.find('=');
    if (eq == std::string_view::npos ||
        !internal::AsciiEqualsIgnoreCase(Trim(param.substr(0, eq)), name)) {
      continue;
    }
    std::string_view v = Trim(param.substr(eq + 1));
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
      v = v.substr(1, v.size() - 2);
    }
    return v;
  }
  return std::nullopt;
}

// The boundaries servers may read in a multipart Content-Type, each once
// (at most six): the `boundary` parameter (RFC 2046); PHP's, the text
// after the first `=` that follows the first "boundary" (first as written,
// else in any case) up to a `,` or `;` (or the closing quote of a quoted
// one); Rack's, after the last "boundary=" in any case, up to a `"`, `;`
// or `,`; each also without its surrounding blanks. A client that writes
// the field so that two servers read two boundaries has its body read
// with both.
absl::InlinedVector<std::string_view, 6> Boundaries(std::string_view content_type) {
  absl::InlinedVector<std::string_view, 6> out;
  const auto add = [&](std::string_view b) {
    for (std::string_view v : {b, Trim(b)}) {
      if (!v.empty() && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
  };
  if (const std::optional<std::string_view> b = FieldParam(content_type, "boundary")) add(*b);
  const std::string lower = internal::AsciiLower(content_type);
  size_t php = content_type.find("boundary");
  if (php == std::string_view::npos) php = lower.find("boundary");
  if (php != std::string_view::npos) {
    if (const size_t eq = content_type.find('=', php); eq != std::string_view::npos) {
      std::string_view v = content_type.substr(eq + 1);
      if (!v.empty() && v.front() == '"') {
        v.remove_prefix(1);
        v = v.substr(0, v.find('"'));
      } else {
        v = v.substr(0, v.find_first_of(",;"));
      }
      add(v);
    }
  }
  if (const size_t rack = lower.rfind("boundary="); rack != std::string::npos) {
    std::string_view v = content_type.substr(rack + 9);
    if (!v.empty() && v.front() == '"') v.remove_prefix(1);
    add(v.substr(0, v.find_first_of("\";,")));
  }
  return out;
}

// The methods a multipart body's `_method` parts name. Read loosely, so as
// to find a part wherever a server might: a part begins after any
// "--boundary", its head ends at the first empty line (CRLF or LF), its
// value ends before the line break ahead of the next "--boundary".
void MultipartMethods(std::string_view boundary, std::string_view body,
                      EndsKept<std::string>& methods) {
  const std::string delimiter = internal::Cat("--", boundary);
  // glibc's memmem takes linear time whatever the two texts (a boundary may
  // be as long as the header; a naive search multiplies the lengths).
  const auto find = [&](size_t from) {
    const void* hit =
        memmem(body.data() + from, body.size() - from, delimiter.data(), delimiter.size());
    return hit == nullptr ? std::string_view::npos
                          : static_cast<size_t>(static_cast<const char*>(hit) - body.data());
  };
  std::string name_buffer;
  for (size_t at = find(0); at != std::string_view::npos;) {
    const size_t start = at + delimiter.size();
    at = find(start);
    std::string_view part = body.substr(start, at == std::string_view::npos ? at : at - start);
    const size_t line = part.find('\n');
    if (line == std::string_view::npos) continue;
    part.remove_prefix(line + 1);  // the rest of the delimiter's line
    size_t head_end = part.find("\r\n\r\n");
    size_t value_start = head_end + 4;
    if (const size_t lf = part.find("\n\n"); lf < head_end) {
      head_end = lf;
      value_start = lf + 2;
    }
    if (head_end == std::string_view::npos) continue;
    bool named = false;
    for (std::string_view head = part.substr(0, head_end); !head.empty();) {
      const size_t eol = head.find('\n');
      const std::string_view field = head.substr(0, eol);
      head = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 1);
      const size_t colon = field.find(':');
      if (colon == std::string_view::npos ||
          !internal::AsciiEqualsIgnoreCase(Trim(field.substr(0, colon)), "content-disposition")) {
        continue;
      }
      const std::optional<std::string_view> name =
          FieldParam(Trim(field.substr(colon + 1)), "name");
      const std::optional<std::string_view> php =
          name ? PhpParamName(*name, name_buffer) : std::nullopt;
      named = named || (php && *php == "_method");
    }
    if (!named) continue;
    std::string_view value = part.substr(value_start);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    if (!value.empty() && value.back() == '\r') value.remove_suffix(1);
    methods.Add(std::string(value));
  }
}

}  // namespace

absl::InlinedVector<std::string, 2> FormMethods(std::optional<std::string_view> content_type,
                                                std::string_view body) {
  // Rack's media type ends at a `;` or a `,`, and an empty one is no type:
  // a POST without one is a form to it.
  const std::string_view media =
      content_type ? Trim(content_type->substr(0, content_type->find_first_of(";,"))) : "";
  if (media.empty() ||
      internal::AsciiEqualsIgnoreCase(media, "application/x-www-form-urlencoded")) {
    return QueryMethods(body);
  }
  EndsKept<std::string> methods;
  if (media.size() > 10 && internal::AsciiEqualsIgnoreCase(media.substr(0, 10), "multipart/")) {
    for (std::string_view boundary : Boundaries(*content_type)) {
      MultipartMethods(boundary, body, methods);
    }
  }
  return std::move(methods).Take();
}

// Paths are compared without case (PathMatches): where an upstream tells
// the spellings apart, a policy counts more of its requests than it must,
// never fewer. So are hosts a request names besides Host
// (ForwardedHosts) and the paths an upstream may route it by: decoded
// whole, behind a PHP front controller, or named in the query
// (UpstreamPaths).
bool Matches(const MatchConfig& match, const RequestFacts& request) {
  OtherReadings others;
  return MatchesAs(match, request, &others);
}

bool FromTrustedProxy(std::string_view peer_ip, const std::vector<Cidr>& trusted_proxies) {
  if (trusted_proxies.empty()) return false;
  const std::optional<std::array<uint8_t, 16>> parsed = ParseIp(peer_ip);
  if (!parsed) return false;
  return std::any_of(trusted_proxies.begin(), trusted_proxies.end(),
                     [&](const Cidr& c) { return c.Contains(*parsed); });
}

std::string ClientIp(const RequestFacts& request, const std::vector<Cidr>& trusted_proxies,
                     std::string_view real_ip_header) {
  if (!FromTrustedProxy(request.peer_ip, trusted_proxies)) {
    return std::string(request.peer_ip);  // headers from an untrusted peer are ignored
  }
  // Every line of the one header believed, in order: together they are one
  // list (RFC 9110 section 5.3), its right end written by the nearest proxy.
  std::vector<std::string_view> hops;
  const bool forwarded = real_ip_header == "forwarded";
  if (request.header_lines) {
    for (std::string_view line : request.header_lines(real_ip_header)) {
      ForEachElement(line, [&](std::string_view element) {
        hops.push_back(forwarded ? ForwardedFor(element) : element);
      });
    }
  } else if (std::optional<std::string_view> line = request.header(real_ip_header)) {
    ForEachElement(*line, [&](std::string_view element) {
      hops.push_back(forwarded ? ForwardedFor(element) : element);
    });
  }
  // From the right: each trusted hop vouches for the one to its left; the
  // first hop that is not a trusted proxy is the client. A hop that is not
  // an address ends the walk: the client is then the last hop that was
  // vouched for (the proxy that passed the garbage on), never an address
  // further left, which the client may have written itself.
  std::string client(request.peer_ip);
  for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
    const std::optional<std::array<uint8_t, 16>> ip = HopAddress(*it);
    if (!ip) break;
    client = FormatIp(*ip);
    if (!std::any_of(trusted_proxies.begin(), trusted_proxies.end(),
                     [&](const Cidr& c) { return c.Contains(*ip); })) {
      break;
    }
  }
  return client;
}

// The client as the `client_ip` key part counts it (ClientIpPrefix): the
// network of the prefix's length its address is in, written
// "2001:db8:1:2::/64", or at a full length the address itself. An IPv4
// client written IPv4-mapped (`::ffff:192.0.2.1`), or translated by NAT64
// under the well-known prefix (`64:ff9b::192.0.2.1`, RFC 6052), is counted
// as IPv4, never as an IPv6 /64 that every such client would share. So is
// a tunnel's client, by the IPv4 address its IPv6 one holds: 6to4's
// (`2002:c000:22d::/48` is 192.0.2.45's, RFC 3056: by its /64 one client
// would be 65,536) and Teredo's (`2001:0:...`, the last 32 bits inverted,
// RFC 4380: by its /64 every client of one Teredo server would be one).
// What does not parse as an address (a link-local peer with its zone) is
// counted as written.
std::string CountedClient(std::string ip, const ClientIpPrefix& prefix) {
  if (prefix.ipv4 == 32 && ip.find(':') == std::string::npos) return ip;
  std::optional<std::array<uint8_t, 16>> address = ParseIp(ip);
  if (!address) return ip;
  static constexpr std::array<uint8_t, 12> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr std::array<uint8_t, 12> kNat64 = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  std::array<uint8_t, 16>& a = *address;
  if (std::equal(kNat64.begin(), kNat64.end(), a.begin())) {
    std::copy(kMapped.begin(), kMapped.end(), a.begin());  // its IPv4 address
  } else if (a[0] == 0x20 && a[1] == 0x02) {               // 6to4: 2002:V4ADDR::/48
    std::copy(a.begin() + 2, a.begin() + 6, a.begin() + 12);
    std::copy(kMapped.begin(), kMapped.end(), a.begin());
  } else if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0 && a[3] == 0) {  // Teredo: 2001::/32
    for (int i = 12; i < 16; ++i) a[i] = static_cast<uint8_t>(~a[i]);
    std::copy(kMapped.begin(), kMapped.end(), a.begin());
  }
  const bool v4 = std::equal(kMapped.begin(), kMapped.end(), address->begin());
  const int bits = v4 ? prefix.ipv4 : prefix.ipv6;
  if (bits == (v4 ? 32 : 128)) return FormatIp(*address);
  const int kept = v4 ? 96 + bits : bits;  // of the 128-bit form
  for (int i = 0; i < 16; ++i) {
    (*address)[i] &= static_cast<uint8_t>(0xff00 >> std::clamp(kept - 8 * i, 0, 8));
  }
  return internal::Cat(FormatIp(*address), "/", bits);
}

std::optional<std::string> Policy::KeyFor(const RequestFacts& request, std::string_view route,
                                          const std::vector<Cidr>& trusted_proxies,
                                          std::string_view real_ip_header) const {
  std::string key;
  bool first = true;
  for (const KeyPart& part : config_.key) {
    if (!first) key.push_back('|');
    first = false;
    switch (part.kind) {
      case KeyPart::Kind::kClientIp:
        AppendEscaped(key, CountedClient(ClientIp(request, trusted_proxies, real_ip_header),
                                         config_.client_ip_prefix));
        break;
      case KeyPart::Kind::kHeader:
      case KeyPart::Kind::kClientCert: {
        // A key header sent twice is no key: a client could send a fresh
        // value first, which the key would take, and its own after it,
        // which an upstream that reads a header's last line would take.
        std::optional<std::string_view> value;
        if (part.kind == KeyPart::Kind::kClientCert) {
          value = request.client_cert;
        } else {
          value =
              request.header_once ? request.header_once(part.header) : request.header(part.header);
        }
        if (!value || value->empty()) {
          if (config_.on_missing_key == MissingKey::kDeny) return std::nullopt;
          // Fall back to the client's address, marked so it never shares a
          // bucket with a value that happens to look like an IP.
          key += "ip:";
          AppendEscaped(key, CountedClient(ClientIp(request, trusted_proxies, real_ip_header),
                                           config_.client_ip_prefix));
        } else if (part.header == "authorization" || part.header == "proxy-authorization") {
          AppendEscaped(key, CredentialsKey(*value));
        } else {
          AppendEscaped(key, *value);
        }
        break;
      }
      case KeyPart::Kind::kPath: {
        // Without case, a trailing '/', a folder's index page, a PHP
        // front controller or a format suffix, decoded whole, as paths are
        // matched: `/LOGIN`, `/login/`, `/login/index.php`, `/login%2F`,
        // `/index.php/login` and `/login.json` are no buckets of their own
        // (Rails and Spring MVC before 5.3 route `/login.<anything>` to
        // `/login`). Nor is a script's PATH_INFO: `/wp-login.php/1`,
        // `/wp-login.php/2`, ... all run wp-login.php, so they are its
        // bucket (ScriptPath); only a front controller by its usual name
        // (index.php) is keyed by the path it routes.
        const std::optional<std::string> decoded = DecodedPath(request.path);
        std::string_view path = decoded ? *decoded : request.path;
        const std::optional<std::string> routed =
            FrontControllerPath(path, SplitAtScript(path), /*named=*/true);
        if (routed) path = *routed;
        AppendEscaped(
            key, WithoutFormatSuffix(WithoutTrailingSlash(WithoutDirectoryIndex(ScriptPath(path)))),
            /*lower=*/true);
        break;
      }
      case KeyPart::Kind::kRoute:
        AppendEscaped(key, route);
        break;
      case KeyPart::Kind::kGlobal:
        key += "*";
        break;
    }
  }
  return key;
}

Duration Policy::Period(size_t index) const {
  if (limiter_ == nullptr) return config_.limits.at(index).options.rate.period;
  return RateOf(limiter_->limits()[index]).period;
}

int64_t Policy::WindowSeconds(size_t index) const {
  return std::max<int64_t>(1, Period(index).CeilSeconds());
}

Duration Policy::JitterFor(size_t index) const {
  if (config_.on_deny.retry_after_jitter) return *config_.on_deny.retry_after_jitter;
  if (Concurrent(index) && HoldEstimate() > Duration::Zero()) {
    return DefaultRetryAfterJitter(HoldEstimate());
  }
  return DefaultRetryAfterJitter(Period(index));
}

bool Policy::Concurrent(size_t index) const {
  return limiter_ != nullptr && index < limiter_->limits().size() &&
         IsConcurrency(limiter_->limits()[index]);
}

void Policy::ObserveHold(Duration hold) const { holds_->Observe(hold); }

Duration Policy::HoldEstimate() const { return holds_->value(); }

Policy::Counters Policy::CountersFor(Metrics& metrics, const std::string& label, Outcome last) {
  static constexpr std::array<const char*, kOutcomes> kOutcomeNames = {
      "allowed", "denied", "shadow_denied", "delayed", "missing_key"};
  Counters counters{};
  for (int o = 0; o <= last; ++o) {
    counters[o] =
        metrics.Get("sluice_decisions_total", {{"policy", label}, {"outcome", kOutcomeNames[o]}});
  }
  return counters;
}

absl::StatusOr<std::shared_ptr<const PolicySet>> PolicySet::Create(const Config& config,
                                                                   Store& store, Store* shared,
                                                                   const Clock& clock,
                                                                   const PolicySet* previous,
                                                                   Metrics& metrics) {
  auto set = std::make_shared<PolicySet>();
  set->config_ = config;
  set->largest_body_bytes_ = config.server.max_body_bytes;
  for (const RouteConfig& route : config.routes) {
    set->largest_body_bytes_ = std::max(set->largest_body_bytes_, route.max_body_bytes.value_or(0));
  }
  // A match's paths are compared with requests' normalized paths, so they
  // are read the same way ("/%6Cogin" is "/login"; "/a;b" would otherwise
  // never match, since no normalized path holds a ';').
  const auto normalize = [](MatchConfig& match) {
    if (match.path) match.path = NormalizePath(*match.path);
    if (match.path_prefix) match.path_prefix = NormalizePath(*match.path_prefix);
  };
  for (PolicyConfig& pc : set->config_.policies) {
    if (pc.match) normalize(*pc.match);
  }
  for (RouteConfig& route : set->config_.routes) normalize(route.match);
  for (const PolicyConfig& pc : set->config_.policies) {
    std::shared_ptr<Limiter> limiter;
    const Policy* before = previous != nullptr ? previous->Find(pc.name) : nullptr;
    if (before != nullptr && before->config_.limits == pc.limits &&
        before->config_.on_store_error == pc.on_store_error &&
        before->config_.long_keys == pc.long_keys) {
      limiter = before->limiter_;  // same limits: keep the keys' state
    } else {
      LimiterOptions options;
      options.name = pc.name;
      options.on_store_error = pc.on_store_error;
      options.long_keys = pc.long_keys;
      options.clock = &clock;
      for (const LimitSpec& spec : pc.limits) {
        options.limits.push_back(spec.options);
        if (spec.scope == Scope::kGlobal && shared == nullptr) {
          return absl::FailedPreconditionError(internal::Cat(
              "policy \"", pc.name,
              "\": a global limit needs the shared store, and this "
              "process started without store.redis (store changes take effect at the next "
              "start)"));
        }
        options.stores.push_back(spec.scope == Scope::kGlobal ? shared : nullptr);
        options.leases.push_back(spec.lease);
      }
      absl::StatusOr<std::unique_ptr<Limiter>> made = Limiter::Create(store, options);
      if (!made.ok()) return made.status();
      limiter = std::shared_ptr<Limiter>(std::move(*made));
    }
    set->by_name_[pc.name] = set->policies_.size();
    set->policies_.emplace_back(pc, std::move(limiter),
                                Policy::CountersFor(metrics, pc.name, Policy::kMissingKey),
                                metrics.Get("sluice_store_errors_total", {{"policy", pc.name}}));
    // The keys denied lately outlive a reload that keeps the policy's name.
    set->policies_.back().top_keys_ = before != nullptr && before->top_keys_ != nullptr
                                          ? before->top_keys_
                                          : std::make_shared<metrics::TopKeys>();
    if (pc.match && pc.match->method && *pc.match->method != "POST") {
      set->other_methods_.push_back(*pc.match);
      set->other_methods_.back().method.reset();
    }
  }
  return std::shared_ptr<const PolicySet>(std::move(set));
}

const Policy* PolicySet::Find(std::string_view name) const {
  auto it = by_name_.find(absl::string_view(name.data(), name.size()));
  return it == by_name_.end() ? nullptr : &policies_[it->second];
}

PolicyList PolicySet::Matching(const RequestFacts& request) const {
  PolicyList out;
  OtherReadings others;
  for (const Policy& p : policies_) {
    if (p.config_.match && MatchesAs(*p.config_.match, request, &others)) out.push_back(&p);
  }
  return out;
}

bool PolicySet::MayCountByBodyMethod(const RequestFacts& request) const {
  if (other_methods_.empty() || !internal::AsciiEqualsIgnoreCase(request.method, "POST")) {
    return false;
  }
  OtherReadings others;
  return std::any_of(other_methods_.begin(), other_methods_.end(),
                     [&](const MatchConfig& match) { return MatchesAs(match, request, &others); });
}

const RouteConfig* PolicySet::RouteFor(const RequestFacts& request) const {
  for (const RouteConfig& route : config_.routes) {
    if (MatchesAs(route.match, request, /*others=*/nullptr)) return &route;
  }
  return nullptr;
}

}  // namespace sluice::policy
