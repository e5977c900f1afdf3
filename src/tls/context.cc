#include "tls/context.h"

#include <algorithm>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <boost/asio/ip/address.hpp>

#include "base/cat.h"

namespace sluice::tls {
namespace {

using internal::Cat;

// Trusts the authorities of `file` (`key` names it in errors), or the
// system's when `file` is empty.
absl::Status Trust(SSL_CTX* ctx, const std::string& file, std::string_view who,
                   std::string_view key) {
  if (file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return absl::InvalidArgumentError(
          Cat(who, ": the system's trusted authorities: ", OpenSslReason("not readable")));
    }
    return absl::OkStatus();
  }
  if (SSL_CTX_load_verify_locations(ctx, file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(
        Cat(who, " ", key, " ", file, ": ", OpenSslReason("no certificate read")));
  }
  return absl::OkStatus();
}

// Presents the certificate chain and key of `files`.
absl::Status Present(SSL_CTX* ctx, const Files& files, std::string_view who) {
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        Cat(who, " cert_file ", files.cert_file, ": ", OpenSslReason("no certificate read")));
  }
  // OpenSSL checks the key against the certificate as it reads it.
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string reason = OpenSslReason("no key read");
    return absl::InvalidArgumentError(Cat(who, " key_file ", files.key_file, ": ", reason,
                                          reason == "key values mismatch"
                                              ? Cat(": not the key of cert_file ", files.cert_file)
                                              : ""));
  }
  return absl::OkStatus();
}

// ALPN: the listener's protocol (`arg`: its name as the extension spells
// it, a length byte first) when the client offers it; otherwise no
// protocol is chosen and the handshake goes on (RFC 7301 lets a server
// ignore the extension), so a client that offers only others learns it
// from the answer.
int SelectProtocol(SSL*, const unsigned char** out, unsigned char* out_len, const unsigned char* in,
                   unsigned int in_len, void* arg) {
  const auto* wanted = static_cast<const unsigned char*>(arg);
  for (unsigned int i = 0; i < in_len;) {
    const unsigned int len = in[i];
    if (i + 1 + len > in_len) break;
    if (len == wanted[0] && std::equal(wanted + 1, wanted + 1 + len, in + i + 1)) {
      *out = in + i + 1;
      *out_len = static_cast<unsigned char>(len);
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + len;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

// Has a verification by `param` require the certificate to name `name`: an
// IP address against its IP SANs, else a host name against its DNS names
// (`host` then true). False when OpenSSL refuses the name.
bool RequireName(X509_VERIFY_PARAM* param, const std::string& name, bool& host) {
  boost::system::error_code not_address;
  boost::asio::ip::make_address(name, not_address);
  host = static_cast<bool>(not_address);
  return (host ? X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0)
               : X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())) == 1;
}

}  // namespace

std::string OpenSslReason(std::string_view otherwise) {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return std::string(otherwise);
  const char* reason = ERR_reason_error_string(code);
  return reason != nullptr ? std::string(reason) : std::string(otherwise);
}

absl::StatusOr<std::shared_ptr<Context>> ClientContext(const Files& files, std::string_view who) {
  auto ctx = std::make_shared<Context>(Context::tls_client);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  if (absl::Status s = Trust(native, files.ca_file, who, "ca_file"); !s.ok()) return s;
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(Cat(who, ": give cert_file and key_file together"));
  }
  if (!files.cert_file.empty()) {
    if (absl::Status s = Present(native, files, who); !s.ok()) return s;
  }
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  return ctx;
}

namespace {

// One certificate's server context (ServerContext, without by_name).
absl::StatusOr<std::shared_ptr<Context>> OneServerContext(const Files& files, std::string_view who,
                                                          Protocol protocol) {
  auto ctx = std::make_shared<Context>(Context::tls_server);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  // The server's order of ciphers, not the client's; no renegotiation a
  // client starts (a handshake's CPU, asked for again and again).
  // A client that closes without close_notify ends the stream as one that
  // sends it does: HTTP frames its messages itself.
  SSL_CTX_set_options(native, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION |
                                  SSL_OP_IGNORE_UNEXPECTED_EOF);
  // A read takes what the socket holds, not a record's header first and
  // its body in a second system call.
  SSL_CTX_set_read_ahead(native, 1);
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(Cat(who, ": give cert_file and key_file"));
  }
  if (absl::Status s = Present(native, files, who); !s.ok()) return s;
  if (!files.ca_file.empty()) {
    if (absl::Status s = Trust(native, files.ca_file, who, "client_ca_file"); !s.ok()) return s;
    // The authorities named to the client, so that it picks a certificate
    // they signed.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca_file.c_str());
    if (names == nullptr) {
      return absl::InvalidArgumentError(
          Cat(who, " client_ca_file ", files.ca_file, ": ", OpenSslReason("no certificate read")));
    }
    SSL_CTX_set_client_CA_list(native, names);
    SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  if (!files.peer_name.empty()) {
    if (files.ca_file.empty()) {
      return absl::InvalidArgumentError(Cat(who, ": client_name needs client_ca_file"));
    }
    // Checked as the chain is: a certificate without the name fails the
    // handshake.
    bool host = false;
    if (!RequireName(SSL_CTX_get0_param(native), files.peer_name, host)) {
      return absl::InvalidArgumentError(Cat(who, " client_name ", files.peer_name, ": ",
                                            OpenSslReason("not a name or an address")));
    }
  }
  // Resumed sessions are this server's alone (OpenSSL refuses to resume
  // one, failing the handshake, when a client certificate is asked for and
  // no context is set).
  static constexpr unsigned char kSessionContext[] = {'s', 'l', 'u', 'i', 'c', 'e'};
  SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext);
  static constexpr unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  static constexpr unsigned char kHttp2[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_select_cb(
      native, SelectProtocol,
      const_cast<unsigned char*>(protocol == Protocol::kHttp2 ? kHttp2 : kHttp11));
  // Sessions resumed by ticket: no cache kept per client in this process.
  SSL_CTX_set_session_cache_mode(native, SSL_SESS_CACHE_OFF);
  return ctx;
}

// The contexts a server context switches a connection to by its SNI.
struct ByName {
  std::vector<std::shared_ptr<Context>> contexts;
};

int ChooseByName(SSL* ssl, int*, void* arg) {
  const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  if (name == nullptr) return SSL_TLSEXT_ERR_OK;  // no SNI: the default certificate
  for (const std::shared_ptr<Context>& ctx : static_cast<const ByName*>(arg)->contexts) {
    X509* cert = SSL_CTX_get0_certificate(ctx->native_handle());
    if (cert != nullptr && X509_check_host(cert, name, 0, 0, nullptr) == 1) {
      SSL_set_SSL_CTX(ssl, ctx->native_handle());
      break;
    }
  }
  return SSL_TLSEXT_ERR_OK;  // a name no certificate carries: the default one
}

}  // namespace

absl::StatusOr<std::shared_ptr<Context>> ServerContext(const Files& files, std::string_view who,
                                                       Protocol protocol) {
  absl::StatusOr<std::shared_ptr<Context>> first = OneServerContext(files, who, protocol);
  if (!first.ok() || files.by_name.empty()) return first;
  auto by_name = std::make_shared<ByName>();
  for (size_t i = 0; i < files.by_name.size(); ++i) {
    Files one = files;
    one.cert_file = files.by_name[i].first;
    one.key_file = files.by_name[i].second;
    absl::StatusOr<std::shared_ptr<Context>> made =
        OneServerContext(one, Cat(who, " certificates[", i, "]"), protocol);
    if (!made.ok()) return made.status();
    by_name->contexts.push_back(*std::move(made));
  }
  SSL_CTX* native = (*first)->native_handle();
  SSL_CTX_set_tlsext_servername_callback(native, ChooseByName);
  SSL_CTX_set_tlsext_servername_arg(native, by_name.get());
  // The context handed out owns the ones it switches to.
  struct Owner {
    std::shared_ptr<Context> first;
    std::shared_ptr<ByName> by_name;
  };
  auto owner = std::make_shared<Owner>(Owner{*std::move(first), std::move(by_name)});
  Context* handed = owner->first.get();
  return std::shared_ptr<Context>(std::move(owner), handed);
}

bool ExpectPeerName(SSL* ssl, const std::string& name) {
  bool host = false;
  if (!RequireName(SSL_get0_param(ssl), name, host)) return false;
  // SNI carries host names only, never an address.
  return !host || SSL_set_tlsext_host_name(ssl, const_cast<char*>(name.c_str())) == 1;
}

std::string HandshakeFailure(const SSL* ssl, std::string_view otherwise) {
  const long verified = SSL_get_verify_result(ssl);
  if (verified != X509_V_OK) {
    return Cat("the certificate is not trusted: ", X509_verify_cert_error_string(verified));
  }
  return std::string(otherwise);
}

}  // namespace sluice::tls
