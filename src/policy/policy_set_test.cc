#include "policy/policy_set.h"

#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/cat.h"
#include "policy/headers.h"
#include "policy/request_text.h"
#include "sluice/store/memory_store.h"

namespace sluice::policy {
namespace {

using internal::Cat;
using ::testing::ElementsAre;

constexpr Time kStart = Time::FromUnixMicros(1'700'000'000'000'000);

struct FakeRequest {
  std::string method = "GET";
  std::string path = "/";
  std::string raw_path;  // empty: `path` as sent
  std::string host = "example.com";
  std::string peer = "203.0.113.9";
  std::map<std::string, std::string> headers;  // lower-case names

  RequestFacts Facts() const {
    RequestFacts f;
    f.method = method;
    f.path = path;
    f.raw_path = raw_path;
    f.host = host;
    f.peer_ip = peer;
    f.header = [this](std::string_view name) -> std::optional<std::string_view> {
      auto it = headers.find(std::string(name));
      if (it == headers.end()) return std::nullopt;
      return std::string_view(it->second);
    };
    return f;
  }
};

std::vector<Cidr> Trust(std::initializer_list<const char*> nets) {
  std::vector<Cidr> out;
  for (const char* n : nets) out.push_back(*ParseCidr(n));
  return out;
}

constexpr std::string_view kXff = "x-forwarded-for";

TEST(ClientIp, IgnoresForwardedForFromAnUntrustedPeer) {
  FakeRequest r;
  r.headers["x-forwarded-for"] = "198.51.100.1";
  EXPECT_EQ(ClientIp(r.Facts(), {}, kXff), "203.0.113.9");
  EXPECT_EQ(ClientIp(r.Facts(), Trust({"10.0.0.0/8"}), kXff), "203.0.113.9");
}

TEST(ClientIp, TakesTheRightMostUntrustedHopBehindTrustedProxies) {
  FakeRequest r;
  r.peer = "10.0.0.2";
  // The client may put anything on the left; only hops added by our proxies count.
  r.headers["x-forwarded-for"] = "6.6.6.6, 198.51.100.1, 10.0.0.7";
  EXPECT_EQ(ClientIp(r.Facts(), Trust({"10.0.0.0/8"}), kXff), "198.51.100.1");
}

TEST(ClientIp, EveryLineOfTheHeaderIsOneList) {
  // A client's own X-Forwarded-For line first, the proxy's appended as a
  // second line: the proxy's (right-most) line decides.
  FakeRequest r;
  r.peer = "10.0.0.2";
  const std::vector<std::string> lines = {"6.6.6.6", "198.51.100.1"};
  RequestFacts facts = r.Facts();
  facts.header = [&](std::string_view) -> std::optional<std::string_view> { return lines[0]; };
  facts.header_lines = [&](std::string_view name) {
    EXPECT_EQ(name, kXff);
    return std::vector<std::string_view>(lines.begin(), lines.end());
  };
  EXPECT_EQ(ClientIp(facts, Trust({"10.0.0.0/8"}), kXff), "198.51.100.1");
}

TEST(ClientIp, ReadsOnlyTheNamedHeader) {
  FakeRequest r;
  r.peer = "127.0.0.1";
  r.headers["forwarded"] = "for=198.51.100.1;proto=http, for=\"[2001:db8::7]:4711\"";
  r.headers["x-real-ip"] = "198.51.100.3";
  r.headers["x-forwarded-for"] = "198.51.100.4";
  const std::vector<Cidr> trusted = Trust({"127.0.0.1/32"});
  EXPECT_EQ(ClientIp(r.Facts(), trusted, "forwarded"), "2001:db8::7");
  EXPECT_EQ(ClientIp(r.Facts(), trusted, "x-real-ip"), "198.51.100.3");
  EXPECT_EQ(ClientIp(r.Facts(), trusted, kXff), "198.51.100.4");
  // A header the operator did not name is never read: a client sending one
  // behind a proxy that sets another cannot choose its address.
  FakeRequest spoof;
  spoof.peer = "127.0.0.1";
  spoof.headers["forwarded"] = "for=192.0.2.66";
  spoof.headers["x-forwarded-for"] = "192.0.2.67";
  spoof.headers["x-real-ip"] = "198.51.100.3";
  EXPECT_EQ(ClientIp(spoof.Facts(), trusted, "x-real-ip"), "198.51.100.3");
  FakeRequest none;
  none.peer = "127.0.0.1";
  none.headers["forwarded"] = "for=192.0.2.66";
  EXPECT_EQ(ClientIp(none.Facts(), trusted, "x-real-ip"), "127.0.0.1");
}

TEST(ClientIp, ForwardedQuotesPortsAndCase) {
  FakeRequest r;
  r.peer = "127.0.0.1";
  const std::vector<Cidr> trusted = Trust({"127.0.0.1/32"});
  r.headers["forwarded"] = "For=\"198.51.100.9:80\";by=x";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, "forwarded"), "198.51.100.9");
  // A comma inside a quoted value does not start a new element.
  r.headers["forwarded"] = "for=192.0.2.1, for=\"198.51.100.8\";note=\"a, b\"";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, "forwarded"), "198.51.100.8");
  // An element without for= is not an address: the walk stops at the proxy.
  r.headers["forwarded"] = "for=192.0.2.1, proto=https";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, "forwarded"), "127.0.0.1");
}

TEST(ClientIp, StopsAtGarbageWithoutReadingFurtherLeft) {
  // Left of a hop that is not an address, every value may be the client's
  // own: the client is the proxy that passed the garbage on.
  FakeRequest r;
  r.peer = "10.0.0.2";
  r.headers["x-forwarded-for"] = "198.51.100.1, not-an-ip";
  EXPECT_EQ(ClientIp(r.Facts(), Trust({"10.0.0.0/8"}), kXff), "10.0.0.2");
  r.headers["x-forwarded-for"] = "198.51.100.1, not-an-ip, 10.0.0.9";
  EXPECT_EQ(ClientIp(r.Facts(), Trust({"10.0.0.0/8"}), kXff), "10.0.0.9");
}

TEST(ClientIp, EveryHopTrustedGivesTheLeftMost) {
  FakeRequest r;
  r.peer = "10.0.0.2";
  r.headers["x-forwarded-for"] = "10.0.0.5, 10.0.0.7";
  EXPECT_EQ(ClientIp(r.Facts(), Trust({"10.0.0.0/8"}), kXff), "10.0.0.5");
}

TEST(ClientIp, OneAddressOneKeyWhateverItsSpelling) {
  FakeRequest r;
  r.peer = "10.0.0.2";
  const std::vector<Cidr> trusted = Trust({"10.0.0.0/8"});
  r.headers["x-forwarded-for"] = "2001:0DB8:0:0::1";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, kXff), "2001:db8::1");
  r.headers["x-forwarded-for"] = "[2001:db8::1]:443";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, kXff), "2001:db8::1");
  r.headers["x-forwarded-for"] = "::ffff:198.51.100.1";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, kXff), "198.51.100.1");
  r.headers["x-forwarded-for"] = "198.51.100.1:5555";
  EXPECT_EQ(ClientIp(r.Facts(), trusted, kXff), "198.51.100.1");
}

TEST(Matches, ChecksEveryGivenField) {
  FakeRequest r;
  r.method = "POST";
  r.path = "/login";
  r.headers["x-api-key"] = "k";
  EXPECT_TRUE(Matches({.path_prefix = "/log"}, r.Facts()));
  EXPECT_FALSE(Matches({.path = "/log"}, r.Facts()));
  EXPECT_TRUE(Matches({.path = "/login", .method = "POST"}, r.Facts()));
  EXPECT_FALSE(Matches({.method = "GET"}, r.Facts()));
  EXPECT_TRUE(Matches({.host = "example.com"}, r.Facts()));
  EXPECT_TRUE(Matches({.headers = {"x-api-key"}}, r.Facts()));
  EXPECT_FALSE(Matches({.headers = {"x-other"}}, r.Facts()));
}

TEST(Matches, APathWithoutCase) {
  // Express and ASP.NET Core route /LOGIN to their /login, IIS serves it.
  FakeRequest r;
  for (const char* path : {"/LOGIN", "/Login", "/login"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/Log"}, r.Facts())) << path;
    EXPECT_FALSE(Matches({.path = "/log"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/login/"}, r.Facts())) << path;  // the prefix's own path
    EXPECT_FALSE(Matches({.path_prefix = "/login/x"}, r.Facts())) << path;
  }
  r.path = "/loginx";
  EXPECT_FALSE(Matches({.path_prefix = "/login/"}, r.Facts()));
  r.path = "/";
  EXPECT_TRUE(Matches({.path_prefix = "/"}, r.Facts()));
}

TEST(Matches, AnExactPathAsFrameworksRouteIt) {
  // Express and Rails route /login/ to /login; Rails /login.json, and
  // Spring MVC before 5.3 /login.do.
  FakeRequest r;
  for (const char* path : {"/login/", "/login.json", "/Login.do", "/login.", "/login"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path = "/login/"}, r.Facts())) << path;
  }
  for (const char* path : {"/login/x", "/login.json/x", "/loginx", "/logi", "/", "/.login"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  r.path = "/";
  EXPECT_TRUE(Matches({.path = "/"}, r.Facts()));
  r.path = "/.json";
  EXPECT_FALSE(Matches({.path = "/"}, r.Facts()));
}

TEST(Matches, ThePathBehindAPhpFrontController) {
  // Laravel and Symfony route /index.php/login as /login, /index.php as /.
  FakeRequest r;
  for (const char* path : {"/index.php/login", "/app_dev.PHP/login/", "/index.php/login.json"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/login"}, r.Facts())) << path;
  }
  r.path = "/index.php";
  EXPECT_TRUE(Matches({.path = "/"}, r.Facts()));
  EXPECT_TRUE(Matches({.path = "/index.php"}, r.Facts()));
  for (const char* path :
       {"/index.php/x/login", "/index.phpx/login", "/.php/login", "/a/index.php/login"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  // Installed in a folder, the route is read in the folder:
  // /blog/index.php/login is the app's /login, which is /blog/login.
  for (const char* path : {"/blog/index.php/login", "/blog/app.php/login/", "/blog/x.php/login"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/blog/login"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/blog/login"}, r.Facts())) << path;
  }
  r.path = "/blog/a.cgi/index.php/login";  // the first script is the one run
  EXPECT_FALSE(Matches({.path = "/blog/login"}, r.Facts()));
}

TEST(Matches, TheScriptAServerRunsForALongerPath) {
  // Apache (AcceptPathInfo, on for PHP and CGI), PHP-FPM behind NGINX's
  // fastcgi_split_path_info and IIS run /wp-login.php for /wp-login.php/x,
  // the rest its PATH_INFO: the first segment naming such a script.
  FakeRequest r;
  for (const char* path :
       {"/wp-login.php/x", "/wp-login.php//x.php/y", "/WP-LOGIN.PHP/x", "/wp-login.php%2Fx"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/wp-login.php"}, r.Facts())) << path;
  }
  for (const char* path : {"/blog/login.aspx/x", "/blog/login.aspx/", "/blog/Login.ASPX/x.php"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/blog/login.aspx"}, r.Facts())) << path;
  }
  for (const auto& [path, script] : std::vector<std::pair<const char*, const char*>>{
           {"/cgi-bin/login.cgi/x", "/cgi-bin/login.cgi"},
           {"/cgi-bin/login.pl/x", "/cgi-bin/login.pl"},
           {"/a/login.php5/x", "/a/login.php5"},
           {"/a/login.phtml/x", "/a/login.phtml"},
           {"/a/login.svc/x", "/a/login.svc"},
           {"/cgi-bin/login/x", "/cgi-bin/login"},  // ScriptAlias /cgi-bin/: any file
           {"/app/CGI-BIN/login/x/y.php/z", "/app/cgi-bin/login"}}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = script}, r.Facts())) << path;
  }
  r.path = "/login/index.php/x";  // the folder by its index page
  EXPECT_TRUE(Matches({.path = "/login/"}, r.Facts()));
  r.path = "/login.php/x";  // a format suffix, as /login.php is
  EXPECT_TRUE(Matches({.path = "/login"}, r.Facts()));
  // The first script only (a file has no children), and only a segment
  // that names a script and has more after it.
  for (const char* path : {"/x.php/wp-login.php/y", "/wp-login.phpx/y", "/wp-login.jsp/y",
                           "/.php/y", "/wp-login.php.txt/y", "/x/wp-login.php/y"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/wp-login.php"}, r.Facts())) << path;
  }
}

TEST(Matches, AScriptFoundByItsNameWithoutExtension) {
  // Apache with MultiViews negotiates /wp-login.php for /wp-login, and
  // runs it for /wp-login/x, the rest its PATH_INFO (extensionless
  // rewrites do the first too); /login/index is the folder's index page.
  FakeRequest r;
  for (const char* path :
       {"/wp-login", "/wp-login/", "/wp-login/x", "/WP-Login/x/y.php", "/wp-login%2Fx"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/wp-login.php"}, r.Facts())) << path;
  }
  for (const char* path : {"/blog/login", "/blog/login/x"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/blog/login.aspx"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path = "/blog/login.aspx/"}, r.Facts())) << path;
  }
  for (const char* path : {"/login/index", "/login/index/", "/login/Index/x"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login/"}, r.Facts())) << path;
  }
  r.path = "/x/index/login/";  // the first index is the one run
  EXPECT_FALSE(Matches({.path = "/login/"}, r.Facts()));
  // A front controller by its name routes the rest in its folder.
  for (const char* path : {"/index/login", "/blog/index/login", "/blog/Index/login/"}) {
    r.path = path;
    const char* route = path[1] == 'b' ? "/blog/login" : "/login";
    EXPECT_TRUE(Matches({.path = route}, r.Facts())) << path;
  }
  r.path = "/x.php/index/login";  // /x.php runs
  EXPECT_FALSE(Matches({.path = "/login"}, r.Facts()));
  r.path = "/login/index";
  EXPECT_TRUE(Matches({.path = "/login/index.php"}, r.Facts()));
  // Only a script's name (negotiation looks for `wp-login.x.*`), and only
  // the name as a whole segment.
  for (const char* path : {"/wp-login.x", "/wp-log", "/wp-loginx", "/x/wp-login", "/wp"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/wp-login.php"}, r.Facts())) << path;
  }
  for (const char* path : {"/login", "/login/x"}) {  // /login.html is no script
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login.html"}, r.Facts())) << path;
  }
}

TEST(Matches, ThePathDecodedWhole) {
  // WSGI servers hand Django and Flask the path with every escape decoded
  // (PATH_INFO), and Symfony's router matches it so: `/login%2F` is their
  // `/login/`.
  FakeRequest r;
  for (const char* path : {"/login%2F", "/login%2f", "/index.php%2Flogin"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  r.path = "/admin%2Fusers";
  EXPECT_TRUE(Matches({.path_prefix = "/admin/"}, r.Facts()));
  r.path = "/login%3F";  // "/login?": another path to them too
  EXPECT_FALSE(Matches({.path = "/login"}, r.Facts()));
}

TEST(Matches, IisPercentUEscapes) {
  // http.sys takes `%uNNNN` by default (PercentUAllowed): `/%u006Cogin` is
  // IIS's `/login`.
  FakeRequest r;
  for (const char* path : {"/%u006Cogin", "/%U006cOGIN", "/logi%u006E", "/x/..%u002Flogin",
                           "/%u006C%u006F%u0067%u0069%u006E/", "/%u006Cogin%5C"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  // Not escapes: nothing is decoded, and nothing else matches.
  for (const char* path : {"/%u006Cogi", "/%u06Cogin", "/%u00G6login", "/%ulogin"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  r.path = "/%u00E9t%u00E9";  // a code point past ASCII, in UTF-8
  EXPECT_TRUE(Matches({.path = "/\xC3\xA9t\xC3\xA9"}, r.Facts()));
}

TEST(Matches, ThePathDecodedWholeThenNormalized) {
  // NGINX decodes every escape of a path, `%2F` included, then merges
  // slashes and applies dot segments: each of these is in its
  // `location /login` (NGINX 1.22 answers them from it), and in a policy
  // on /login. Above the root, a `..` stays at the root, as everywhere
  // else a path is normalized.
  FakeRequest r;
  for (const char* path : {"/%2Flogin", "/%2flogin", "/x/..%2Flogin", "/x%2F..%2Flogin",
                           "/a%2F..%2F..%2Flogin", "/x/..%2F%2Flogin%2F"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/login"}, r.Facts())) << path;
  }
  // Decoded, these are other paths still.
  for (const char* path : {"/x%2Flogin", "/login%2F..", "/%2Fadmin%2F..%2Flogout"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login"}, r.Facts())) << path;
  }
}

TEST(Matches, ThePathAsNginxReadsIt) {
  // NormalizePath drops a segment's parameters and reads a backslash as a
  // slash (Tomcat, IIS); NGINX does neither, and serves these from its
  // `location /login`: a prefix policy on /login counts them.
  FakeRequest r;
  for (const char* raw : {"/login/..;/", "/login/..;x/y", "/login\\..\\x", "/%2Flogin%5C..",
                          "/%2flogin%5c%2e%2e", "/%2Flogin%3B/..%3B/"}) {
    r.raw_path = raw;
    r.path = NormalizePath(raw);
    EXPECT_TRUE(Matches({.path_prefix = "/login"}, r.Facts())) << raw;
    EXPECT_FALSE(Matches({.path_prefix = "/admin"}, r.Facts())) << raw;
  }
  // Without the path as sent, only the normalized one is read.
  r.raw_path.clear();
  r.path = NormalizePath("/login/..;/");
  EXPECT_FALSE(Matches({.path_prefix = "/login"}, r.Facts()));
}

TEST(Matches, ThePathAPhpApplicationReadsInTheQuery) {
  FakeRequest r;
  RequestFacts facts = r.Facts();
  const auto matches = [&](std::string_view path, std::string_view query, const MatchConfig& m) {
    facts.path = path;
    facts.query = query;
    return Matches(m, facts);
  };
  const MatchConfig login{.path = "/login"};
  // CodeIgniter 3 routes a folder's page whose query starts with '/' by the
  // query, up to a '?'.
  EXPECT_TRUE(matches("/", "/login", login));
  EXPECT_TRUE(matches("/index.php", "/login?x=1", login));
  EXPECT_TRUE(matches("/index.php/", "/x/../LOGIN/", login));  // normalized
  EXPECT_TRUE(matches("/shop/", "/login", {.path = "/shop/login"}));
  EXPECT_TRUE(matches("/shop/index.php", "/login", {.path_prefix = "/shop/log"}));
  EXPECT_FALSE(matches("/", "x/login", login));
  EXPECT_FALSE(matches("/", "/login&x=1", login));
  // Drupal 7 routes any request with a `q` by it (PHP keeps the last).
  const MatchConfig user_login{.path = "/user/login"};
  EXPECT_TRUE(matches("/", "q=user/login", user_login));
  EXPECT_TRUE(matches("/node/1", "q=%2Fuser%2Flogin", user_login));
  EXPECT_TRUE(matches("/", "q=user&q=user/login", user_login));
  EXPECT_FALSE(matches("/", "q=user/login&q=user", user_login));
  EXPECT_TRUE(matches("/drupal/", "q=user/login", {.path = "/drupal/user/login"}));
  EXPECT_FALSE(matches("/", "qq=user/login", user_login));
  // WordPress serves the REST route of `rest_route` on any path; PHP reads
  // `rest.route` as `rest_route`.
  const MatchConfig users{.path_prefix = "/wp-json/wp/v2/users"};
  EXPECT_TRUE(matches("/", "rest_route=/wp/v2/users", users));
  EXPECT_TRUE(matches("/2024/hello/", "rest.route=%2Fwp%2Fv2%2Fusers%2F1", users));
  EXPECT_TRUE(matches("/blog/", "rest_route=/wp/v2/users", {.path = "/blog/wp-json/wp/v2/users"}));
  EXPECT_FALSE(matches("/", "rest_route[]=/wp/v2/users", users));
  // None of them is a route's: routes go by the path as sent.
  EXPECT_FALSE(matches("/", "", login));
}

TEST(Matches, AHostAnUpstreamMayServeTheRequestFor) {
  // Rack (so Rails' host constraints) serves a request for its
  // X-Forwarded-Host, and Express, Django, Symfony and Spring do when they
  // trust the proxy in front: a policy on that host counts the request.
  const MatchConfig api{.host = "api.example.com"};
  FakeRequest r;
  r.host = "www.example.com";
  EXPECT_FALSE(Matches(api, r.Facts()));
  for (const char* value : {"api.example.com", "API.Example.com:8443",
                            "a.example, api.example.com.", "\"api.example.com\""}) {
    FakeRequest x = r;
    x.headers["x-forwarded-host"] = value;
    EXPECT_TRUE(Matches(api, x.Facts())) << value;
  }
  for (const char* value : {"for=1.2.3.4;host=api.example.com", "host=\"api.example.com:443\"",
                            "proto=https, Host=api.example.com;proto=http"}) {
    FakeRequest f = r;
    f.headers["forwarded"] = value;
    EXPECT_TRUE(Matches(api, f.Facts())) << value;
  }
  // Of a long list, the first and the last 8 are read (an upstream reads
  // one near an end): a field of thousands costs each policy no more.
  std::string list;
  for (int i = 0; i < 1000; ++i) list += (i == 500 ? "api.example.com, " : "x.example, ");
  FakeRequest middle = r;
  middle.headers["x-forwarded-host"] = list + "x.example";
  EXPECT_FALSE(Matches(api, middle.Facts()));
  middle.headers["x-forwarded-host"] = list + "api.example.com";
  EXPECT_TRUE(Matches(api, middle.Facts()));
  middle.headers["x-forwarded-host"] = "api.example.com, " + list + "x.example";
  EXPECT_TRUE(Matches(api, middle.Facts()));
  FakeRequest other = r;
  other.headers["x-forwarded-host"] = "api.example.com.evil";
  other.headers["forwarded"] = "for=api.example.com";
  EXPECT_FALSE(Matches(api, other.Facts()));
}

TEST(Matches, AMethodAsAnUpstreamMayReadIt) {
  // Django, Flask, Laravel and Symfony upper-case the method: `post` is
  // their POST, and a policy on POST must count it.
  FakeRequest r;
  r.path = "/login";
  for (const char* method : {"post", "Post", "POST"}) {
    r.method = method;
    EXPECT_TRUE(Matches({.path = "/login", .method = "POST"}, r.Facts())) << method;
  }
  EXPECT_FALSE(Matches({.method = "PUT"}, r.Facts()));
  // A HEAD runs the GET's handler in most frameworks: a GET policy counts it.
  r.method = "head";
  EXPECT_TRUE(Matches({.method = "GET"}, r.Facts()));
  EXPECT_TRUE(Matches({.method = "HEAD"}, r.Facts()));
  EXPECT_FALSE(Matches({.method = "POST"}, r.Facts()));
  r.method = "GET";
  EXPECT_FALSE(Matches({.method = "HEAD"}, r.Facts()));
  // A POST that names another method in an override field is a request of
  // that method too (Laravel, Symfony, Rack, Express's method-override),
  // whichever line names it; another method's override is not read.
  for (const char* name : {"x-http-method-override", "x-http-method", "x-method-override"}) {
    FakeRequest o;
    o.method = "POST";
    o.headers[name] = "delete";
    EXPECT_TRUE(Matches({.method = "DELETE"}, o.Facts())) << name;
    EXPECT_TRUE(Matches({.method = "POST"}, o.Facts())) << name;
    EXPECT_FALSE(Matches({.method = "PUT"}, o.Facts())) << name;
    o.method = "GET";
    EXPECT_FALSE(Matches({.method = "DELETE"}, o.Facts())) << name;
  }
  // So does a _method query parameter (Laravel, Symfony), escaped or not.
  FakeRequest query;
  query.method = "POST";
  RequestFacts with_query = query.Facts();
  // PHP reads `.method` and ` _method` as `_method`; Rack 2 splits at ';'.
  for (std::string_view q : {"_method=DELETE", "a=1&_method=delete", "%5Fmethod=%44ELETE&b",
                             ".method=DELETE", "+_method=DELETE", "a=1;_method=DELETE"}) {
    with_query.query = q;
    EXPECT_TRUE(Matches({.method = "DELETE"}, with_query)) << q;
  }
  for (std::string_view q :
       {"", "_method", "x_method=DELETE", "_method=DELETEX", "_method=%ZZ", "_method[]=DELETE",
        "_method[a]=DELETE", "_method[=DELETE", "_method=DEL+ETE"}) {
    with_query.query = q;
    EXPECT_FALSE(Matches({.method = "DELETE"}, with_query)) << q;
  }
  // Of a thousand, the first and the last few are read, once a request.
  std::string many;
  for (int i = 0; i < 1000; ++i) many += "_method=PUT&";
  const std::string last = many + "_method=DELETE";
  with_query.query = last;
  EXPECT_TRUE(Matches({.method = "DELETE"}, with_query));
  const std::string middle = many + "_method=DELETE&" + many;
  with_query.query = middle;
  EXPECT_FALSE(Matches({.method = "DELETE"}, with_query));
  FakeRequest lines;
  lines.method = "POST";
  RequestFacts facts = lines.Facts();
  facts.header_lines = [](std::string_view name) {
    return name == "x-http-method-override" ? std::vector<std::string_view>{"PATCH", "DELETE"}
                                            : std::vector<std::string_view>{};
  };
  EXPECT_TRUE(Matches({.method = "DELETE"}, facts));
  EXPECT_TRUE(Matches({.method = "PATCH"}, facts));
}

TEST(FormMethods, AFormsMethodFieldsAsRackAndPhpReadThem) {
  using Methods = absl::InlinedVector<std::string, 2>;
  // No Content-Type (Rack reads the body as a form), or a form's.
  EXPECT_EQ(FormMethods(std::nullopt, "a=1&_method=PUT"), Methods{"PUT"});
  EXPECT_EQ(FormMethods("Application/X-WWW-Form-Urlencoded; charset=utf-8", "%5Fmethod=patch"),
            Methods{"patch"});
  EXPECT_EQ(FormMethods("application/x-www-form-urlencoded", ".method=DELETE"),
            Methods{"DELETE"});                               // PHP's name for it
  EXPECT_EQ(FormMethods("", "_method=PUT"), Methods{"PUT"});  // no media type: a form to Rack
  EXPECT_EQ(FormMethods(" ; charset=utf-8", "_method=PUT"), Methods{"PUT"});
  EXPECT_EQ(FormMethods("application/x-www-form-urlencoded, x", "_method=PUT"), Methods{"PUT"});
  EXPECT_EQ(FormMethods("text/plain", "_method=PUT"), Methods{});
  // Multipart: each part named `_method`, its line breaks CRLF or LF, its
  // name quoted or not, the boundary quoted or not.
  const std::string crlf =
      "--xyz\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nann\r\n"
      "--xyz\r\ncontent-disposition: form-data; NAME=\"_method\"\r\n\r\nPUT\r\n--xyz--\r\n";
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=xyz", crlf), Methods{"PUT"});
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=\"xyz\"", crlf), Methods{"PUT"});
  EXPECT_EQ(FormMethods("Multipart/Mixed;boundary=xyz", crlf), Methods{"PUT"});
  const std::string lf =
      "preamble\n--b\nContent-Disposition: form-data; name=_method\n\nDELETE\n--b\n"
      "Content-Disposition: form-data; filename=\"_method\"; name='.method'\n\nPATCH\n--b--";
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=b", lf), (Methods{"DELETE", "PATCH"}));
  // Where servers read the boundary differently (PHP the first "boundary",
  // Rack the last "boundary="), the body is read with each.
  const std::string by_php =
      "--php\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nPUT\r\n--php--";
  EXPECT_EQ(FormMethods("multipart/form-data; x=boundary=php; boundary=real", by_php),
            Methods{"PUT"});
  const std::string by_rack =
      "--rack\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--rack--";
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=real; x=\"boundary=rack\"", by_rack),
            Methods{"DELETE"});
  EXPECT_EQ(FormMethods("multipart/form-data; BOUNDARY = spaced ",
                        "--spaced\n"
                        "Content-Disposition: form-data; name=_method\n\nPATCH\n--spaced--"),
            Methods{"PATCH"});
  // A part's filename is not its name; no boundary, no parts.
  const std::string file =
      "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"_method\"\r\n\r\nPUT\r\n--b--";
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=b", file), Methods{});
  EXPECT_EQ(FormMethods("multipart/form-data", crlf), Methods{});
  EXPECT_EQ(FormMethods("multipart/form-data; boundary=xyz", "--xyz\r\nno head end"), Methods{});
}

TEST(Matches, AMethodABodyNames) {
  // What the gateway read of a POST's body counts as the header and the
  // query do: a request of that method as well, only for a POST.
  FakeRequest r;
  r.method = "POST";
  RequestFacts facts = r.Facts();
  const std::vector<std::string> named = {"put"};
  facts.body_methods = named;
  EXPECT_TRUE(Matches({.method = "PUT"}, facts));
  EXPECT_TRUE(Matches({.method = "POST"}, facts));
  EXPECT_FALSE(Matches({.method = "DELETE"}, facts));
  facts.method = "PATCH";
  EXPECT_FALSE(Matches({.method = "PUT"}, facts));
}

absl::StatusOr<Config> Parse(const std::string& yaml) { return ParseConfig(yaml, "test.yaml"); }

// A policy set made from a config's text, with the store, clock and
// metrics it uses (they outlive it).
struct Built {
  MemoryStore store;
  ManualClock clock{kStart};
  Metrics metrics;
  std::shared_ptr<const PolicySet> set;
};

std::unique_ptr<Built> Build(const std::string& yaml) {
  absl::StatusOr<Config> config = Parse(yaml);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  auto built = std::make_unique<Built>();
  absl::StatusOr<std::shared_ptr<const PolicySet>> set =
      PolicySet::Create(*config, built->store, nullptr, built->clock, nullptr, built->metrics);
  EXPECT_TRUE(set.ok()) << set.status();
  if (!set.ok()) return nullptr;
  built->set = *std::move(set);
  return built;
}

TEST(PolicySet, ARouteGoesByHostAlone) {
  // A policy on a host counts a request that names it in X-Forwarded-Host;
  // the route, which picks the upstream, goes by Host.
  const std::unique_ptr<Built> built = Build(R"(
routes:
  - name: api
    match: {host: api.example.com}
    upstream: http://127.0.0.1:1
  - name: www
    upstream: http://127.0.0.1:2
policies:
  - name: api
    match: {host: api.example.com}
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  FakeRequest r;
  r.host = "www.example.com";
  r.headers["x-forwarded-host"] = "api.example.com";
  EXPECT_EQ(built->set->RouteFor(r.Facts())->name, "www");
  r.host = "api.example.com";
  r.path = "/index.php/x";
  EXPECT_EQ(built->set->RouteFor(r.Facts())->name, "api");
  ASSERT_EQ(built->set->Matching(r.Facts()).size(), 1u);
}

TEST(PolicySet, APostsBodyIsReadWhenAPolicyOfAnotherMethodWouldCountIt) {
  const std::unique_ptr<Built> built = Build(R"(
policies:
  - name: password
    match: {path: /password, method: PUT}
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: login
    match: {path: /login, method: POST}
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  FakeRequest r;
  r.method = "POST";
  r.path = "/password";
  EXPECT_TRUE(built->set->MayCountByBodyMethod(r.Facts()));
  r.path = "/PASSWORD.json";  // as the policy reads paths
  EXPECT_TRUE(built->set->MayCountByBodyMethod(r.Facts()));
  r.path = "/login";  // only a POST policy there: the body need not be read
  EXPECT_FALSE(built->set->MayCountByBodyMethod(r.Facts()));
  r.method = "PUT";
  r.path = "/password";
  EXPECT_FALSE(built->set->MayCountByBodyMethod(r.Facts()));
  r.method = "POST";
  RequestFacts facts = r.Facts();
  const std::vector<std::string> named = {"PUT"};
  facts.body_methods = named;
  ASSERT_EQ(built->set->Matching(facts).size(), 1u);
  EXPECT_EQ(built->set->Matching(facts)[0]->name(), "password");
}

TEST(PolicySet, APolicyReadsAFieldUnderTheNamesAnUpstreamReadsAsIt) {
  // CGI, WSGI, Rack and PHP servers read X_Api_Key as X-Api-Key: a policy
  // on requests that carry X-Api-Key counts it, and a POST's
  // X_HTTP_Method_Override; a route goes by the names as sent.
  const std::unique_ptr<Built> built = Build(R"(
routes:
  - name: keyed
    match: {headers: [X-Api-Key]}
    upstream: http://127.0.0.1:1
  - name: rest
    upstream: http://127.0.0.1:2
policies:
  - name: keyed
    match: {headers: [X-Api-Key]}
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: delete
    match: {method: DELETE}
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  FakeRequest r;
  r.method = "POST";
  RequestFacts facts = r.Facts();
  facts.cgi_lines = [](std::string_view name) {
    return name == "x-api-key" || name == "x-http-method-override"
               ? std::vector<std::string_view>{name == "x-api-key" ? "k" : "DELETE"}
               : std::vector<std::string_view>{};
  };
  EXPECT_EQ(built->set->Matching(facts).size(), 2u);
  EXPECT_EQ(built->set->RouteFor(facts)->name, "rest");
}

TEST(Matches, AFolderByItsIndexPage) {
  // Apache and NGINX with PHP, Tomcat and IIS serve /login/ with its index
  // page: /login/index.php is /login/, both ways.
  FakeRequest r;
  for (const char* path : {"/login/index.php", "/login/INDEX.PHP", "/login/default.aspx"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login/"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path = "/login"}, r.Facts())) << path;
  }
  for (const char* path : {"/login/", "/login", "/login/index.php"}) {
    r.path = path;
    EXPECT_TRUE(Matches({.path = "/login/index.php"}, r.Facts())) << path;
    EXPECT_TRUE(Matches({.path_prefix = "/login/index.php"}, r.Facts())) << path;
  }
  r.path = "/";
  EXPECT_TRUE(Matches({.path = "/index.php"}, r.Facts()));
  for (const char* path : {"/login/other.php", "/login/x/index.php", "/loginindex.php"}) {
    r.path = path;
    EXPECT_FALSE(Matches({.path = "/login/index.php"}, r.Facts())) << path;
    EXPECT_FALSE(Matches({.path = "/login/"}, r.Facts())) << path;
  }
  r.path = "/login/other.php";
  EXPECT_FALSE(Matches({.path_prefix = "/login/index.php"}, r.Facts()));
}

TEST(PolicySet, ReadsAMatchsPathsAsRequestsAreRead) {
  // Requests are matched on their normalized paths, so the paths a config
  // gives are normalized too: written unusually, they still match.
  const std::unique_ptr<Built> built = Build(R"(
routes:
  - name: api
    match: {path_prefix: "/api;v=2/"}
    upstream: http://127.0.0.1:3000
policies:
  - name: login
    match: {path: /%6Cogin}
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: files
    match: {path_prefix: "//files/./x/../"}
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  const PolicySet* set = built->set.get();
  FakeRequest r;
  r.path = "/login";
  ASSERT_EQ(set->Matching(r.Facts()).size(), 1u);
  EXPECT_EQ(set->Matching(r.Facts())[0]->name(), "login");
  r.path = "/files/a";
  ASSERT_EQ(set->Matching(r.Facts()).size(), 1u);
  EXPECT_EQ(set->Matching(r.Facts())[0]->name(), "files");
  r.path = "/api/users";
  ASSERT_NE(set->RouteFor(r.Facts()), nullptr);
  EXPECT_EQ(set->RouteFor(r.Facts())->name, "api");
}

TEST(PolicySet, BuildsKeysFromParts) {
  const std::unique_ptr<Built> built = Build(R"(
policies:
  - name: p
    key: [client_ip, "header:X-Api-Key", path, route]
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: everyone
    key: [global]
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: strict
    key: ["header:X-Api-Key"]
    on_missing_key: deny
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: lenient
    key: ["header:X-Api-Key"]
    on_missing_key: client_ip
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  const PolicySet* set = built->set.get();
  FakeRequest r;
  r.path = "/a|b";
  r.headers["x-api-key"] = "key\\1";
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff), "203.0.113.9|key\\\\1|/a\\|b|app");
  EXPECT_EQ(*set->Find("everyone")->KeyFor(r.Facts(), "app", {}, kXff), "*");
  r.path = "/A|B/";  // the path part without case or a trailing '/', as paths are matched
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff), "203.0.113.9|key\\\\1|/a\\|b|app");
  r.path = "/index.php%2Fa|b%2F";  // nor a PHP front controller, nor escapes
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff), "203.0.113.9|key\\\\1|/a\\|b|app");
  r.path = "/a|b/Index.php";  // nor a folder's index page
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff), "203.0.113.9|key\\\\1|/a\\|b|app");
  // Nor a script's PATH_INFO (/a|b.php/1, /a|b.php/2, ... all run
  // /a|b.php), nor a format suffix (Rails and Spring MVC before 5.3 route
  // /a|b.json and /a|b.x.y to /a|b). Only a front controller by its usual
  // name is keyed by the path it routes.
  for (const char* path : {"/a|b.php/1", "/A|B.PHP/2/", "/a|b.php%2F3", "/a|b.json", "/a|b.x.y",
                           "/a|b.", "/a|b.aspx/1/2", "/%u0061|b"}) {
    r.path = path;
    EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff),
              "203.0.113.9|key\\\\1|/a\\|b|app")
        << path;
  }
  r.path = "/a.b/.env";  // a dot in another segment, or before any name, stays
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff),
            "203.0.113.9|key\\\\1|/a.b/.env|app");
  r.path = "/app_dev.php/a|b";
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff), "203.0.113.9|key\\\\1|/a\\|b|app");
  r.path = "/x/index.php/a|b";  // in a folder: the folder's /a|b
  EXPECT_EQ(*set->Find("p")->KeyFor(r.Facts(), "app", {}, kXff),
            "203.0.113.9|key\\\\1|/x/a\\|b|app");
  r.path = "/a|b";
  FakeRequest bare;
  EXPECT_EQ(set->Find("strict")->KeyFor(bare.Facts(), "", {}, kXff), std::nullopt);
  EXPECT_EQ(*set->Find("lenient")->KeyFor(bare.Facts(), "", {}, kXff), "ip:203.0.113.9");
  // A key header sent twice is no key (a fresh value first, the client's
  // own after it, for an upstream that reads the last line): as missing.
  RequestFacts twice = r.Facts();
  twice.header_once = [&](std::string_view name) -> std::optional<std::string_view> {
    if (name == "x-api-key") return std::nullopt;  // sent twice
    return r.Facts().header(name);
  };
  EXPECT_EQ(set->Find("strict")->KeyFor(twice, "", {}, kXff), std::nullopt);
  EXPECT_EQ(*set->Find("lenient")->KeyFor(twice, "", {}, kXff), "ip:203.0.113.9");
  EXPECT_EQ(set->Find("p")->KeyFor(twice, "app", {}, kXff), std::nullopt);  // deny
}

TEST(PolicySet, AClientCertificatesSubjectIsAKeyPart) {
  const std::unique_ptr<Built> built = Build(R"(
policies:
  - name: by_cert
    key: [client_cert, route]
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: lenient
    key: [client_cert]
    on_missing_key: client_ip
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  const PolicySet* set = built->set.get();
  FakeRequest r;
  RequestFacts facts = r.Facts();
  facts.client_cert = "CN=api|client,O=Example";
  EXPECT_EQ(*set->Find("by_cert")->KeyFor(facts, "app", {}, kXff), "CN=api\\|client,O=Example|app");
  // No certificate (a plain listener, or one that asks for none): missing.
  EXPECT_EQ(set->Find("by_cert")->KeyFor(r.Facts(), "app", {}, kXff), std::nullopt);
  EXPECT_EQ(*set->Find("lenient")->KeyFor(r.Facts(), "", {}, kXff), "ip:203.0.113.9");
  // A header that says a subject is no certificate.
  r.headers["client-cert"] = "CN=someone";
  EXPECT_EQ(set->Find("by_cert")->KeyFor(r.Facts(), "app", {}, kXff), std::nullopt);
}

TEST(CountedClient, AnIpv6ClientIsItsSlash64ByDefault) {
  const ClientIpPrefix defaults;
  EXPECT_EQ(CountedClient("2001:db8:1:2:aaaa:bbbb:cccc:dddd", defaults), "2001:db8:1:2::/64");
  EXPECT_EQ(CountedClient("2001:db8:1:2::1", defaults), "2001:db8:1:2::/64");
  EXPECT_EQ(CountedClient("2001:db8:1:3::1", defaults), "2001:db8:1:3::/64");
  EXPECT_EQ(CountedClient("203.0.113.9", defaults), "203.0.113.9");
  // IPv4-mapped is IPv4, never the one IPv6 /64 (::/64) every such client shares.
  EXPECT_EQ(CountedClient("::ffff:203.0.113.9", defaults), "203.0.113.9");
  // NAT64's well-known prefix carries an IPv4 client: counted as that client.
  EXPECT_EQ(CountedClient("64:ff9b::203.0.113.9", defaults), "203.0.113.9");
  EXPECT_EQ(CountedClient("64:ff9b::cb00:7109", {.ipv4 = 24, .ipv6 = 64}), "203.0.113.0/24");
  // So do the tunnels: 6to4 (its /48 is its IPv4 address's) and Teredo
  // (RFC 4380's example: 192.0.2.45 behind the server 65.54.227.120).
  EXPECT_EQ(CountedClient("2002:cb00:7109:1::1", defaults), "203.0.113.9");
  EXPECT_EQ(CountedClient("2002:cb00:7109:ffff:1:2:3:4", defaults), "203.0.113.9");
  EXPECT_EQ(CountedClient("2002:cb00:7109::1", {.ipv4 = 24, .ipv6 = 128}), "203.0.113.0/24");
  EXPECT_EQ(CountedClient("2001:0:4136:e378:8000:63bf:3fff:fdd2", defaults), "192.0.2.45");
  EXPECT_EQ(CountedClient("2001:0:4136:e378:8000:63bf:3fff:fdd3", defaults), "192.0.2.44");
  EXPECT_EQ(CountedClient("2001:1::1", defaults), "2001:1::/64");      // not Teredo
  EXPECT_EQ(CountedClient("fe80::1%eth0", defaults), "fe80::1%eth0");  // a zone: as written
}

TEST(CountedClient, AnyPrefixLength) {
  EXPECT_EQ(CountedClient("2001:DB8::1", {.ipv4 = 32, .ipv6 = 128}), "2001:db8::1");
  EXPECT_EQ(CountedClient("2001:db8:abcd:ef12::1", {.ipv4 = 32, .ipv6 = 56}),
            "2001:db8:abcd:ef00::/56");
  EXPECT_EQ(CountedClient("2001:db8:abcd:ef12::1", {.ipv4 = 32, .ipv6 = 1}), "::/1");
  EXPECT_EQ(CountedClient("203.0.113.9", {.ipv4 = 24, .ipv6 = 64}), "203.0.113.0/24");
  EXPECT_EQ(CountedClient("203.0.113.9", {.ipv4 = 21, .ipv6 = 64}), "203.0.112.0/21");
  EXPECT_EQ(CountedClient("::ffff:203.0.113.9", {.ipv4 = 24, .ipv6 = 64}), "203.0.113.0/24");
}

TEST(PolicySet, KeysACredentialAsServersReadIt) {
  const std::unique_ptr<Built> built = Build(R"(
policies:
  - name: token
    key: ["header:Authorization"]
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: api
    key: ["header:X-Api-Key"]
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  FakeRequest r;
  for (const char* value : {"Bearer abc.DEF", "bearer abc.DEF", "BEARER \t  abc.DEF"}) {
    r.headers["authorization"] = value;
    EXPECT_EQ(*built->set->Find("token")->KeyFor(r.Facts(), "", {}, kXff), "bearer abc.DEF")
        << value;
  }
  r.headers["authorization"] = "Bearer abc.def";  // the credentials keep their case
  EXPECT_EQ(*built->set->Find("token")->KeyFor(r.Facts(), "", {}, kXff), "bearer abc.def");
  // Basic credentials as the bytes servers decode them to: "user:pass"
  // and "user:pas".
  for (const char* value : {"Basic dXNlcjpwYXNz", "basic dXNl.cjpw YXNz", "Basic dXNlcjpwYXNz=x",
                            "Basic dXNlcjpwYXNz==", "Basic -dXNlcjpwYXNz_"}) {
    r.headers["authorization"] = value;
    EXPECT_EQ(*built->set->Find("token")->KeyFor(r.Facts(), "", {}, kXff), "basic dXNlcjpwYXNz")
        << value;
  }
  for (const char* value : {"Basic dXNlcjpwYXM=", "Basic dXNlcjpwYXN", "BASIC dXNlcjpwYXP="}) {
    r.headers["authorization"] = value;
    EXPECT_EQ(*built->set->Find("token")->KeyFor(r.Facts(), "", {}, kXff), "basic dXNlcjpwYXM=")
        << value;
  }
  r.headers["authorization"] = "Basic dXNlcjpwYXNt";  // another password: another bucket
  EXPECT_EQ(*built->set->Find("token")->KeyFor(r.Facts(), "", {}, kXff), "basic dXNlcjpwYXNt");
  r.headers["x-api-key"] = "Key  K";  // any other header as sent
  EXPECT_EQ(*built->set->Find("api")->KeyFor(r.Facts(), "", {}, kXff), "Key  K");
}

TEST(PolicySet, KeysAnIpv6ClientByItsNetwork) {
  const std::unique_ptr<Built> built = Build(R"(
client_ip_prefix: {ipv6: 48}
policies:
  - name: wide
    limits: [{algorithm: gcra, rate: 1/s}]
  - name: narrow
    client_ip_prefix: {ipv4: 24, ipv6: 128}
    key: ["header:X-Api-Key"]
    on_missing_key: client_ip
    limits: [{algorithm: gcra, rate: 1/s}]
)");
  ASSERT_NE(built, nullptr);
  const PolicySet* set = built->set.get();
  FakeRequest r;
  r.peer = "2001:db8:1:2::9";
  EXPECT_EQ(*set->Find("wide")->KeyFor(r.Facts(), "", {}, kXff), "2001:db8:1::/48");
  EXPECT_EQ(*set->Find("narrow")->KeyFor(r.Facts(), "", {}, kXff), "ip:2001:db8:1:2::9");
  // Behind a trusted proxy the forwarded address is the one counted.
  r.peer = "127.0.0.1";
  r.headers["x-forwarded-for"] = "198.51.100.77";
  EXPECT_EQ(*set->Find("wide")->KeyFor(r.Facts(), "", Trust({"127.0.0.1"}), kXff), "198.51.100.77");
  EXPECT_EQ(*set->Find("narrow")->KeyFor(r.Facts(), "", Trust({"127.0.0.1"}), kXff),
            "ip:198.51.100.0/24");
}

TEST(PolicySet, AReloadKeepsTheStateOfUnchangedPolicies) {
  const std::string before = R"(
policies:
  - name: same
    limits: [{algorithm: fixed_window, rate: 1/h}]
  - name: changed
    limits: [{algorithm: fixed_window, rate: 1/h}]
)";
  const std::string after = R"(
policies:
  - name: same
    match: {path_prefix: /new}
    limits: [{algorithm: fixed_window, rate: 1/h}]
  - name: changed
    limits: [{algorithm: fixed_window, rate: 2/h}]
)";
  MemoryStore store;
  ManualClock clock(kStart);
  Metrics metrics;
  auto first = *PolicySet::Create(*Parse(before), store, nullptr, clock, nullptr, metrics);
  ASSERT_TRUE(first->Find("same")->limiter().Acquire("k")->allowed);
  ASSERT_TRUE(first->Find("changed")->limiter().Acquire("k")->allowed);
  auto second = *PolicySet::Create(*Parse(after), store, nullptr, clock, first.get(), metrics);
  EXPECT_FALSE(second->Find("same")->limiter().Acquire("k")->allowed);    // state kept
  EXPECT_TRUE(second->Find("changed")->limiter().Acquire("k")->allowed);  // new limits, new state
}

// A policy's answer for the header tests.
PolicyAnswer AnswerOf(std::string_view name, int64_t window_seconds, int64_t limit,
                      int64_t remaining, Duration reset_after) {
  PolicyAnswer a{.name = name, .window_seconds = window_seconds};
  a.decision.allowed = remaining > 0;
  a.decision.limit = limit;
  a.decision.remaining = remaining;
  a.decision.reset_after = reset_after;
  return a;
}

TEST(Headers, RateLimitFieldsAreStructuredFieldLists) {
  PolicyAnswer login = AnswerOf("login", 60, 40, 0, Duration::Seconds(60));
  login.decision.retry_after = Duration::Micros(16'000'001);
  const PolicyAnswer api = AnswerOf("api", 1, 20, 19, Duration::Millis(50));
  EXPECT_EQ(RateLimitPolicyField({login, api}), "\"login\";q=40;w=60, \"api\";q=20;w=1");
  // t of a denial is the (rounded up) wait, not the full reset.
  EXPECT_EQ(RateLimitField({login, api}), "\"login\";r=0;t=17, \"api\";r=19;t=1");
}

TEST(Headers, FieldsAreWrittenAsTheyGoOnTheWireAndReadBack) {
  const PolicyAnswer login = AnswerOf("login", 60, 40, 3, Duration::Seconds(12));
  const PolicyAnswer api = AnswerOf("api", 1, 20, 19, Duration::Millis(50));
  FieldList fields{{.name = "Allow", .value = "POST"}};
  AppendRateLimitHeaders({login, api}, /*legacy=*/true, fields);
  fields.Add("Retry-After", "");
  EXPECT_EQ(fields.wire(),
            "Allow: POST\r\n"
            "RateLimit-Policy: \"login\";q=40;w=60, \"api\";q=20;w=1\r\n"
            "RateLimit: \"login\";r=3;t=12, \"api\";r=19;t=1\r\n"
            "X-RateLimit-Limit: 40\r\n"  // the most restrictive: the fewest remaining
            "X-RateLimit-Remaining: 3\r\n"
            "X-RateLimit-Reset: 12\r\n"
            "Retry-After: \r\n");
  using F = FieldList::Field;
  EXPECT_THAT(fields, ElementsAre(F{"Allow", "POST"},
                                  F{"RateLimit-Policy", "\"login\";q=40;w=60, \"api\";q=20;w=1"},
                                  F{"RateLimit", "\"login\";r=3;t=12, \"api\";r=19;t=1"},
                                  F{"X-RateLimit-Limit", "40"}, F{"X-RateLimit-Remaining", "3"},
                                  F{"X-RateLimit-Reset", "12"}, F{"Retry-After", ""}));
  // Appended to another list, the fields and their places move together.
  FieldList both{{.name = "WWW-Authenticate", .value = "Bearer"}};
  both.Append(fields);
  ASSERT_EQ(both.size(), 8u);
  EXPECT_EQ(both[0], (F{"WWW-Authenticate", "Bearer"}));
  EXPECT_EQ(both[2], (F{"RateLimit-Policy", "\"login\";q=40;w=60, \"api\";q=20;w=1"}));
  EXPECT_EQ(both.back(), (F{"Retry-After", ""}));
  EXPECT_EQ(both.wire(), Cat("WWW-Authenticate: Bearer\r\n", fields.wire()));
  // No enforced answer: no field.
  FieldList none;
  AppendRateLimitHeaders({}, /*legacy=*/true, none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.wire(), "");
}

TEST(Headers, NamesAreQuotedAsStructuredFieldStrings) {
  const std::string name(
      "a\"b\\c\x01\x7f\xc3\xa9"
      "d",
      10);
  PolicyAnswer a{.name = name, .window_seconds = 1};
  a.decision.allowed = true;
  a.decision.limit = 1;
  // Quote and backslash escaped; controls, DEL and non-ASCII bytes dropped.
  EXPECT_EQ(RateLimitPolicyField({a}), R"("a\"b\\cd";q=1;w=1)");
  PolicyAnswer edges{.name = "\"x\"", .window_seconds = 1};
  edges.decision.limit = 1;
  EXPECT_EQ(RateLimitPolicyField({edges}), R"("\"x\"";q=1;w=1)");
}

TEST(Headers, JsonStringsEscapeQuotesBackslashesAndControls) {
  const auto json = [](std::string_view s) {
    std::string out = "[";
    AppendJsonString(out, s);
    return out;
  };
  EXPECT_EQ(json(""), R"(["")");
  EXPECT_EQ(json("plain caf\xc3\xa9"), "[\"plain caf\xc3\xa9\"");
  EXPECT_EQ(json(std::string("\"a\\b\n\x01\x1f"
                             "c\"",
                             9)),
            R"(["\"a\\b\u000a\u0001\u001fc\"")");
  EXPECT_EQ(json("\\"), R"(["\\")");
  // Eight bytes are looked at together until one may need an escape: every
  // byte that needs one, at every place in texts of up to 40 bytes, escaped
  // as one byte at a time escapes it.
  const auto one_at_a_time = [](std::string_view s) {
    std::string out = "[\"";
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (u < 0x20) {
        out += "\\u00";
        out += "0123456789abcdef"[u >> 4];
        out += "0123456789abcdef"[u & 15];
      } else {
        out += c;
      }
    }
    return out + '"';
  };
  std::mt19937_64 rng(11);
  const std::string fillers = "aZ ~\x7f\x80\xc3\xa9\xff";
  const std::string escaped = std::string("\"\\\x01\x1f\n") + '\0';
  for (size_t size = 0; size <= 40; ++size) {
    for (size_t at = 0; at < size; ++at) {
      std::string s(size, 'x');
      for (char& c : s) c = fillers[rng() % fillers.size()];
      s[at] = escaped[rng() % escaped.size()];
      EXPECT_EQ(json(s), one_at_a_time(s)) << size << " " << at;
    }
    std::string plain(size, 'x');
    for (char& c : plain) c = fillers[rng() % fillers.size()];
    EXPECT_EQ(json(plain), one_at_a_time(plain)) << size;
  }
}

TEST(Headers, RetryAfterIsNeverEarlyAndSpreadsOverTheJitter) {
  std::mt19937_64 rng(7);
  const Duration exact = Duration::Micros(2'500'000);
  int64_t low = INT64_MAX, high = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t s = RetryAfterSeconds(exact, Duration::Seconds(4), rng);
    low = std::min(low, s);
    high = std::max(high, s);
  }
  EXPECT_EQ(low, 3);   // ceil(2.5 s): never earlier than the exact time
  EXPECT_EQ(high, 7);  // ceil(2.5 + 4 s)
  EXPECT_EQ(RetryAfterSeconds(exact, Duration::Zero(), rng), 3);
}

}  // namespace
}  // namespace sluice::policy
