#include "server/socket.h"

#if SLUICE_DRAIN_AWARE_READS

#include <sys/epoll.h>

#include <cstdint>

namespace sluice::server::asio_private {
namespace {

// A private member of Asio's, reached the one way C++ allows without
// changing Asio: an explicit instantiation may name it, and the friend
// function it defines hands the member pointer out. One translation unit
// (this one) instantiates each.
template <typename Tag, typename Tag::type kMember>
struct Reach {
  friend typename Tag::type Member(Tag) { return kMember; }
};

// The reactor's epoll descriptor.
struct EpollFd {
  using type = int Reactor::*;
  friend type Member(EpollFd);
};
template struct Reach<EpollFd, &Reactor::epoll_fd_>;

// The events a socket is registered for.
struct RegisteredEvents {
  using type = uint32_t Registration::*;
  friend type Member(RegisteredEvents);
};
template struct Reach<RegisteredEvents, &Registration::registered_events_>;

// The events of a socket's last readiness: its registration's task_result_,
// which the reactor sets before it runs the socket's operations and keeps
// until the next.
struct ReadyEvents {
  using type = unsigned int net::detail::scheduler_operation::*;
  friend type Member(ReadyEvents);
};
template struct Reach<ReadyEvents, &net::detail::scheduler_operation::task_result_>;

}  // namespace

bool PeerClosed(Registration* registration) {
  // A C-style cast: the registration's base is private to Asio.
  auto* op = (net::detail::scheduler_operation*)registration;  // NOLINT
  return (op->*Member(ReadyEvents{}) & EPOLLRDHUP) != 0;
}

bool WatchPeerClose(Reactor& reactor, int fd, Registration* registration) {
  uint32_t& registered = registration->*Member(RegisteredEvents{});
  if ((registered & EPOLLRDHUP) != 0) return true;
  epoll_event ev{};
  ev.events = registered | EPOLLRDHUP;
  ev.data.ptr = registration;
  if (::epoll_ctl(reactor.*Member(EpollFd{}), EPOLL_CTL_MOD, fd, &ev) != 0) return false;
  registered = ev.events;
  return true;
}

}  // namespace sluice::server::asio_private

#endif  // SLUICE_DRAIN_AWARE_READS

namespace sluice::server {
namespace {

int WireRead(BIO* bio, char* out, int size) {
  auto* wire = static_cast<TlsWire*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t n = ::recv(wire->fd, out, static_cast<size_t>(size), 0);
    if (n >= 0) {
      wire->drained = n < size;
      return static_cast<int>(n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wire->drained = true;
      BIO_set_retry_read(bio);
    }
    return -1;
  }
}

int WireWrite(BIO* bio, const char* in, int size) {
  auto* wire = static_cast<TlsWire*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t n = ::send(wire->fd, in, static_cast<size_t>(size), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

long WireCtrl(BIO*, int cmd, long, void*) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is buffered here
}

int WireCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

}  // namespace

BIO* NewTlsWireBio(TlsWire* wire) {
  static BIO_METHOD* const kMethod = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "sluice tls wire");
    if (m != nullptr) {
      BIO_meth_set_read(m, WireRead);
      BIO_meth_set_write(m, WireWrite);
      BIO_meth_set_ctrl(m, WireCtrl);
      BIO_meth_set_create(m, WireCreate);
    }
    return m;
  }();
  if (kMethod == nullptr) return nullptr;
  BIO* bio = BIO_new(kMethod);
  if (bio != nullptr) BIO_set_data(bio, wire);
  return bio;
}

}  // namespace sluice::server
