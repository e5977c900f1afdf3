// The server's TCP socket, and a read that knows when the socket is drained.
//
// Why: Asio (Boost 1.74, Debian 12's) starts every read with a read system
// call, and waits for epoll only when that one finds nothing. It stops
// trying first only after a read of zero bytes. But a request-answer
// exchange nearly always reads nothing on that first try: the client sends
// its next request only after our answer, the upstream its answer only
// after our request. Each such try is a system call that returns EAGAIN,
// as costly as a useful one (bench/README.md, "Reads that know the socket
// is drained").
//
// ReadSome reads as NGINX does: after a read that returns fewer bytes than
// it asked for, the socket is drained, so the next read waits for epoll's
// next readiness event without trying first. That is sound with Asio's
// edge-triggered registration: any byte that arrives after the short read
// raises a new event, which lets the next read try first again. What Asio
// does after its own reads is unchanged.
//
// One thing a short read does not drain: the peer's close (FIN). When it
// came together with the last bytes, in the same readiness event, a read
// returns the bytes and leaves the close, which raises no event of its own
// any more. So, as NGINX does, the socket is also registered for EPOLLRDHUP
// (the peer closed its side), and a short read in whose readiness event the
// close was seen does not count as draining: the next read tries first and
// finds the end of the stream at once. (Without it a client that sent its
// request and shut its side down waited for the idle timeout, and an
// upstream's answer ended by its close waited for the upstream timeout.)
//
// How: the read is a reactor operation of our own, started on the socket's
// registration in Asio's epoll reactor. Its one difference from Asio's is
// the status it reports after a short read ("done and exhausted", which the
// reactor keeps as "do not try first"). This uses Asio's detail namespace,
// and three private members of its epoll reactor (its epoll descriptor, a
// socket's registered events, and the events of its last readiness), so it
// is built for the Boost version it was written against (1.74) on the epoll
// reactor only; with any other, ReadSome is Asio's async_read_some.
//
// ReadTls is the same read through OpenSSL on the socket's descriptor
// (TlsSocket, tls_socket.h): the operation's one try is SSL_read_ex, and
// the socket is drained when OpenSSL's last read of it was short (tls::Wire
// sees it) and OpenSSL holds nothing more, read ahead or decrypted.
//
// Thread-safety: as Asio's socket; a socket belongs to its loop's thread.
#ifndef SLUICE_SERVER_SOCKET_H_
#define SLUICE_SERVER_SOCKET_H_

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <sys/socket.h>

#include <cerrno>
#include <cstddef>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/version.hpp>

#if BOOST_VERSION == 107400 && defined(BOOST_ASIO_HAS_EPOLL) && \
    !defined(BOOST_ASIO_HAS_IO_URING) && !defined(BOOST_ASIO_DISABLE_EPOLL)
#define SLUICE_DRAIN_AWARE_READS 1
#include <boost/asio/detail/handler_alloc_helpers.hpp>
#include <boost/asio/detail/handler_cont_helpers.hpp>
#include <boost/asio/detail/reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#else
#define SLUICE_DRAIN_AWARE_READS 0
#endif

#include "tls/wire.h"

namespace sluice::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Executor = net::io_context::executor_type;

// Every object is bound to its thread's io_context by its concrete executor
// type; the type-erased default (any_io_executor) cost ~5% of a request in
// copies and virtual calls.
template <typename T>
using Task = net::awaitable<T, Executor>;
inline constexpr net::use_awaitable_t<Executor> kUseAwaitable;

#if SLUICE_DRAIN_AWARE_READS
// What ReadSome needs of Asio's epoll reactor that Asio keeps private
// (socket.cc reaches it).
namespace asio_private {

using Reactor = net::detail::epoll_reactor;
using Registration = Reactor::descriptor_state;

// Whether the last readiness event of `registration` saw the peer's close.
bool PeerClosed(Registration* registration);

// Adds EPOLLRDHUP to the events `fd` is registered for with `reactor`
// (once: Asio keeps the registered events, and adds EPOLLOUT to them when a
// write first waits). False if epoll refused.
bool WatchPeerClose(Reactor& reactor, int fd, Registration* registration);

}  // namespace asio_private
#endif

enum class TlsRead { kWait, kDone, kDrained };

// One SSL_read_ex into `buffer`: kWait when OpenSSL waits for the socket
// to be readable; else kDone, with `bytes` read or `ec` set (eof at the
// client's close_notify, or its close: the server's context ignores a bare
// EOF; connection_aborted when TLS fails or would have to write first), or
// kDrained: bytes read, and nothing more without a readiness event.
inline TlsRead TryTlsRead(SSL* ssl, net::mutable_buffer buffer, size_t& bytes,
                          boost::system::error_code& ec) {
  ERR_clear_error();
  if (SSL_read_ex(ssl, buffer.data(), buffer.size(), &bytes) == 1) {
    const auto* wire = static_cast<const tls::Wire*>(BIO_get_data(SSL_get_rbio(ssl)));
    return wire != nullptr && wire->drained && SSL_has_pending(ssl) == 0 ? TlsRead::kDrained
                                                                         : TlsRead::kDone;
  }
  const int error = SSL_get_error(ssl, 0);
  if (error == SSL_ERROR_WANT_READ) return TlsRead::kWait;
  if (error == SSL_ERROR_ZERO_RETURN) {
    ec = net::error::eof;
  } else {
    ec = net::error::connection_aborted;
  }
  ERR_clear_error();
  return TlsRead::kDone;
}

class Socket : public net::basic_stream_socket<tcp, Executor> {
 public:
  using basic_stream_socket::basic_stream_socket;

  // Reads what the socket holds into `buffer`, up to its size, waiting for
  // a byte first if there is none: async_read_some's contract (eof when the
  // peer has closed), without the read that finds nothing (above).
  // `buffer` must not be empty.
  template <typename Token>
  auto ReadSome(net::mutable_buffer buffer, Token&& token);

  // The same, of the bytes `ssl` (TLS on this socket's descriptor)
  // decrypts: eof at the client's close_notify or close; an error when
  // TLS fails, or when OpenSSL would have to write first (a key update the
  // client asked for while not reading: the connection ends).
  template <typename Token>
  auto ReadTls(SSL* ssl, net::mutable_buffer buffer, Token&& token);

 private:
#if SLUICE_DRAIN_AWARE_READS
  template <typename Handler>
  class ReadOp;

  // The loop's epoll reactor, where the socket is registered.
  asio_private::Reactor* reactor_ =
      &net::use_service<asio_private::Reactor>(get_executor().context());
#endif
};

#if SLUICE_DRAIN_AWARE_READS

template <typename Handler>
class Socket::ReadOp final : public net::detail::reactor_op {
 public:
  ReadOp(int fd, asio_private::Registration* registration, bool watching,
         net::mutable_buffer buffer, Handler&& handler, SSL* ssl = nullptr)
      : reactor_op(boost::system::error_code(), &ReadOp::Perform, &ReadOp::Complete),
        fd_(fd),
        registration_(registration),
        watching_(watching),
        buffer_(buffer),
        ssl_(ssl),
        handler_(std::move(handler)) {}

 private:
  // One non-blocking read: not_done on EAGAIN (the reactor queues the
  // operation until epoll says the socket is readable), done_and_exhausted
  // when it took less than it asked for (or nothing: eof), unless the peer's
  // close may wait behind the bytes it took (above): then done.
  static status Perform(reactor_op* base) {
    auto* op = static_cast<ReadOp*>(base);
    if (op->ssl_ != nullptr) return PerformTls(op);
    for (;;) {
      const ssize_t n = ::recv(op->fd_, op->buffer_.data(), op->buffer_.size(), MSG_DONTWAIT);
      if (n > 0) {
        op->bytes_transferred_ = static_cast<size_t>(n);
        if (op->bytes_transferred_ == op->buffer_.size()) return done;
        const bool drained = op->watching_ && !asio_private::PeerClosed(op->registration_);
        return drained ? done_and_exhausted : done;
      }
      if (n == 0) {
        op->ec_ = net::error::eof;
        return done_and_exhausted;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return not_done;
      op->ec_ = boost::system::error_code(errno, boost::asio::error::get_system_category());
      return done;
    }
  }

  static status PerformTls(ReadOp* op) {
    switch (TryTlsRead(op->ssl_, op->buffer_, op->bytes_transferred_, op->ec_)) {
      case TlsRead::kWait:
        return not_done;
      case TlsRead::kDone:
        return done;
      case TlsRead::kDrained:
        break;
    }
    const bool drained = op->watching_ && !asio_private::PeerClosed(op->registration_);
    return drained ? done_and_exhausted : done;
  }

  // Called by the loop with the operation done (owner set), or to destroy
  // it unrun (owner null: the loop is shutting down). The memory goes back
  // before the handler runs, for the read it may start.
  static void Complete(void* owner, net::detail::scheduler_operation* base,
                       const boost::system::error_code&, size_t) {
    auto* op = static_cast<ReadOp*>(base);
    Handler handler(std::move(op->handler_));
    const boost::system::error_code ec = op->ec_;
    const size_t bytes = op->bytes_transferred_;
    op->~ReadOp();
    boost_asio_handler_alloc_helpers::deallocate(op, sizeof(ReadOp), handler);
    if (owner != nullptr) std::move(handler)(ec, bytes);
  }

  const int fd_;
  asio_private::Registration* const registration_;
  const bool watching_;  // the registration has EPOLLRDHUP: a short read may drain
  const net::mutable_buffer buffer_;
  SSL* const ssl_;  // null: a plain read
  Handler handler_;
};

// ReadSome and ReadTls: one operation, whose try is recv or SSL_read_ex.
template <typename Token>
auto Socket::ReadTls(SSL* ssl, net::mutable_buffer buffer, Token&& token) {
  return net::async_initiate<Token, void(boost::system::error_code, size_t)>(
      [this, ssl, buffer](auto handler) {
        using Handler = decltype(handler);
        const bool continuation = boost_asio_handler_cont_helpers::is_continuation(handler);
        void* memory = boost_asio_handler_alloc_helpers::allocate(sizeof(ReadOp<Handler>), handler);
        asio_private::Registration* registration = impl_.get_implementation().reactor_data_;
        // Without EPOLLRDHUP (epoll refused it, a closed socket) no read
        // drains: each tries first, as Asio's own.
        const bool watching =
            registration != nullptr &&
            asio_private::WatchPeerClose(*reactor_, native_handle(), registration);
        auto* op = new (memory) ReadOp<Handler>(native_handle(), registration, watching, buffer,
                                                std::move(handler), ssl);
        // Asio's start_op: tries first only when the reactor has not been
        // told the socket is drained, and queues the operation otherwise. A
        // closed socket (no registration) completes with bad_descriptor.
        reactor_->start_op(net::detail::reactor::read_op, native_handle(), registration, op,
                           continuation, /*allow_speculative=*/true);
      },
      token);
}

template <typename Token>
auto Socket::ReadSome(net::mutable_buffer buffer, Token&& token) {
  return ReadTls(nullptr, buffer, std::forward<Token>(token));
}

#else

template <typename Token>
auto Socket::ReadSome(net::mutable_buffer buffer, Token&& token) {
  return async_read_some(buffer, std::forward<Token>(token));
}

template <typename Token>
auto Socket::ReadTls(SSL* ssl, net::mutable_buffer buffer, Token&& token) {
  return net::async_compose<Token, void(boost::system::error_code, size_t)>(
      [this, ssl, buffer](auto& self, boost::system::error_code ec = {}) {
        size_t bytes = 0;
        if (!ec && TryTlsRead(ssl, buffer, bytes, ec) == TlsRead::kWait) {
          async_wait(wait_read, std::move(self));
          return;
        }
        self.complete(ec, bytes);
      },
      token, *this);
}

#endif  // SLUICE_DRAIN_AWARE_READS

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SOCKET_H_
