// TLS contexts made from PEM files, for both ends sluice plays: the client
// of Redis (redis/client.cc) and the server of its HTTP listeners
// (server/). One place reads the files and turns OpenSSL's errors into
// messages that name the file and why. Internal.
//
// Thread-safety: a context, once made, is used by any number of threads
// (OpenSSL's SSL_CTX is safe for concurrent SSL_new); making one reads the
// files on the calling thread.
#ifndef SLUICE_TLS_CONTEXT_H_
#define SLUICE_TLS_CONTEXT_H_

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <openssl/ssl.h>
#include <boost/asio/ssl/context.hpp>

#include "absl/status/statusor.h"

namespace sluice::tls {

using Context = boost::asio::ssl::context;

// OpenSSL's reason for the last failure on this thread (its error queue
// emptied), or `otherwise` when it gave none.
std::string OpenSslReason(std::string_view otherwise);

// The files a context is made of; paths as the config resolved them.
struct Files {
  std::string cert_file;  // a certificate chain (PEM), with key_file
  std::string key_file;   // its private key (PEM)
  std::string ca_file;    // authorities (PEM) to verify the peer by
  // A server's: the name (a DNS name or an address) every client's
  // certificate must carry, as a subjectAltName; empty: any name.
  std::string peer_name;
  // A server's: more certificates (chain, key), each presented to a client
  // whose SNI one of its DNS names matches; the others get cert_file's.
  std::vector<std::pair<std::string, std::string>> by_name;
};

// A client's context: TLS 1.2 at least, the peer's certificate verified
// against `files.ca_file` (empty: the system's authorities), the client's
// own certificate when `files.cert_file` is given. `who` starts every
// error ("redis tls").
absl::StatusOr<std::shared_ptr<Context>> ClientContext(const Files& files, std::string_view who);

// What a server's listener speaks, chosen by ALPN when a client offers it.
enum class Protocol { kHttp11, kHttp2 };

// A server's context: TLS 1.2 at least, the certificate and key of
// `files` (both required), `protocol` chosen when a client offers it by
// ALPN ("http/1.1", "h2": gRPC's clients require it), and with
// `files.ca_file` a certificate required of every client, signed by one of
// those authorities (mutual TLS) and, with `files.peer_name`, naming it.
// With `files.by_name`, a client that names a host by SNI gets the first
// of those certificates that carries the name (X509_check_host: a DNS name,
// a `*.` wildcard matching one label), each in a context made the same way.
// `who` starts every error ("server.tls").
absl::StatusOr<std::shared_ptr<Context>> ServerContext(const Files& files, std::string_view who,
                                                       Protocol protocol = Protocol::kHttp11);

// Has the handshake of `ssl` (a client's) require the peer's certificate to
// name `name`: an IP address against its IP SANs (and sent as no SNI), a
// host name against its DNS names (and sent as SNI). False when OpenSSL
// refuses the name (OpenSslReason says why).
bool ExpectPeerName(SSL* ssl, const std::string& name);

// Why the handshake of `ssl` (a client's) failed: the certificate's
// verification when that failed, else `otherwise`.
std::string HandshakeFailure(const SSL* ssl, std::string_view otherwise);

}  // namespace sluice::tls

#endif  // SLUICE_TLS_CONTEXT_H_
