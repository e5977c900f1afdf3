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
