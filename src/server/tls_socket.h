// TlsSocket: TLS on a connection of the HTTP listeners (server.tls,
// server.decision.tls), OpenSSL reading and writing the socket's
// descriptor itself, as NGINX has it do.
//
// Why not Asio's ssl::stream: it runs OpenSSL on a pair of memory buffers
// and copies every record between them and the socket, and each stream
// holds four buffers of 17 KiB: an idle connection cost 71 KiB against
// NGINX's 18 (bench/README.md, "HTTPS"). Here OpenSSL keeps its record
// buffers only while a record is under way (SSL_MODE_RELEASE_BUFFERS).
//
// How: the socket is non-blocking; a read is Socket::ReadTls (a reactor
// operation whose try is SSL_read_ex); a write tries SSL_write_ex at once
// and waits for room only when the socket has none; the handshake waits
// for whichever way OpenSSL asks. An answer's head and a small body go as
// one record (one system call).
//
// Thread-safety: as the socket's; it belongs to its loop's thread.
#ifndef SLUICE_SERVER_TLS_SOCKET_H_
#define SLUICE_SERVER_TLS_SOCKET_H_

#include <array>
#include <string>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <boost/asio/redirect_error.hpp>

#include "server/socket.h"
#include "tls/context.h"
#include "tls/wire.h"

namespace sluice::server {

class TlsSocket {
 public:
  // The server's side of a client's connection; with `peer_name`, the
  // client's side of a connection to the upstream of that name (the
  // context verifies its certificate, tls::ExpectPeerName its name).
  TlsSocket(Socket& socket, tls::Context& context, const std::string* peer_name = nullptr)
      : socket_(socket), ssl_(SSL_new(context.native_handle())) {
    if (ssl_ == nullptr) return;
    wire_.fd = socket.native_handle();
    BIO* bio = tls::NewWireBio(&wire_);
    if (bio == nullptr) {
      named_ = false;
      return;
    }
    SSL_set_bio(ssl_, bio, bio);
    if (peer_name == nullptr) {
      SSL_set_accept_state(ssl_);
    } else {
      SSL_set_connect_state(ssl_);
      named_ = tls::ExpectPeerName(ssl_, *peer_name);
    }
    SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                           SSL_MODE_RELEASE_BUFFERS);
  }
  ~TlsSocket() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  TlsSocket(const TlsSocket&) = delete;
  TlsSocket& operator=(const TlsSocket&) = delete;

  Socket& socket() { return socket_; }

  // The handshake; `ec` says why it failed (Failure, on a client's side,
  // in words). The caller's deadline bounds it (it cancels the socket's
  // waits).
  Task<void> Handshake(boost::system::error_code& ec) {
    if (ssl_ == nullptr || !named_) {
      ec = net::error::no_memory;
      co_return;
    }
    socket_.non_blocking(true, ec);
    while (!ec) {
      ERR_clear_error();
      const int r = SSL_do_handshake(ssl_);
      if (r == 1) co_return;
      const int error = SSL_get_error(ssl_, r);
      ERR_clear_error();
      if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) {
        ec = net::error::connection_aborted;
        co_return;
      }
      co_await socket_.async_wait(
          error == SSL_ERROR_WANT_READ ? Socket::wait_read : Socket::wait_write,
          net::redirect_error(kUseAwaitable, ec));
    }
  }

  // Why a client's handshake failed, for its log and its 502.
  std::string Failure(const boost::system::error_code& ec) const {
    if (ssl_ == nullptr) return "out of memory";
    if (!named_) return "the upstream's name cannot be verified";
    return tls::HandshakeFailure(ssl_, ec.message());
  }

  // The subject of the certificate the client presented, once the
  // handshake verified it (a listener with client_ca_file), in RFC 2253's
  // form ("CN=api-client,O=Example"); empty when none.
  std::string ClientSubject() const {
    if (ssl_ == nullptr || SSL_get_verify_result(ssl_) != X509_V_OK) return {};
    X509* cert = SSL_get0_peer_certificate(ssl_);
    if (cert == nullptr) return {};
    BIO* out = BIO_new(BIO_s_mem());
    if (out == nullptr) return {};
    std::string subject;
    if (X509_NAME_print_ex(out, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253) >= 0) {
      char* data = nullptr;
      const long size = BIO_get_mem_data(out, &data);
      if (size > 0) subject.assign(data, static_cast<size_t>(size));
    }
    BIO_free(out);
    return subject;
  }

  // Decrypted bytes (Socket::ReadSome's contract).
  template <typename Token>
  auto ReadSome(net::mutable_buffer buffer, Token&& token) {
    return socket_.ReadTls(ssl_, buffer, std::forward<Token>(token));
  }

  // WriteNow's contract (loop.h): writes what the socket takes now,
  // advancing `buffers`; true when nothing is left. A head and a body that
  // fit one record are joined first, so that they go as one.
  bool WriteNow(std::array<net::const_buffer, 2>& buffers, boost::system::error_code& ec) {
    if (buffers[0].size() > 0 && buffers[1].size() > 0 &&
        buffers[0].size() + buffers[1].size() <= kJoinBytes) {
      joined_.assign(static_cast<const char*>(buffers[0].data()), buffers[0].size());
      joined_.append(static_cast<const char*>(buffers[1].data()), buffers[1].size());
      buffers = {net::buffer(joined_), net::const_buffer()};
    }
    for (net::const_buffer& b : buffers) {
      while (b.size() > 0) {
        ERR_clear_error();
        size_t written = 0;
        if (SSL_write_ex(ssl_, b.data(), b.size(), &written) == 1) {
          b += written;
          continue;
        }
        const int error = SSL_get_error(ssl_, 0);
        ERR_clear_error();
        if (error != SSL_ERROR_WANT_WRITE) ec = net::error::connection_aborted;
        return false;
      }
    }
    // A small answer's room is kept for the next; a large one's is not
    // held by an idle connection.
    if (joined_.capacity() > kKeptBytes) std::string().swap(joined_);
    return true;
  }

  // Writes all of `buffers`, waiting for room as long as it takes (the
  // caller's deadline bounds it).
  Task<void> Write(std::array<net::const_buffer, 2> buffers, boost::system::error_code& ec) {
    while (!WriteNow(buffers, ec) && !ec) {
      co_await socket_.async_wait(Socket::wait_write, net::redirect_error(kUseAwaitable, ec));
    }
  }

  // Sends close_notify if the socket takes it now; the client's is not
  // waited for (HTTP frames its messages itself).
  void Close() {
    if (ssl_ == nullptr || !SSL_is_init_finished(ssl_)) return;
    ERR_clear_error();
    SSL_shutdown(ssl_);
    ERR_clear_error();
  }

 private:
  // The most of a head and body joined into one record (TLS's largest).
  static constexpr size_t kJoinBytes = 16 * 1024;
  static constexpr size_t kKeptBytes = 2 * 1024;

  Socket& socket_;
  tls::Wire wire_;  // before ssl_'s BIO uses it, gone after
  SSL* const ssl_;
  bool named_ = true;   // the peer's name to verify was taken
  std::string joined_;  // a head and body joined, while they are written
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_TLS_SOCKET_H_
