#include "server/socket.h"

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/write.hpp>

namespace sluice::server {
namespace {

// A server-side Socket and the client connected to it over loopback, both
// on one loop that the test runs by hand.
struct Connection {
  Connection() {
    tcp::acceptor acceptor(ioc, tcp::endpoint(net::ip::address_v4::loopback(), 0));
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  }
  void Send(const std::string& bytes) { net::write(client, net::buffer(bytes)); }
  // Runs the loop for `d` (restarted: a loop that ran out of work stays
  // stopped until then).
  void RunFor(std::chrono::milliseconds d) {
    ioc.restart();
    ioc.run_for(d);
  }

  net::io_context ioc{1};
  Socket server{ioc.get_executor()};
  tcp::socket client{ioc};
};

// One ReadSome's outcome, once it has completed.
struct Read {
  std::optional<boost::system::error_code> ec;
  std::string bytes;
};

// Starts a ReadSome of at most `size` bytes into `read`.
void StartRead(Connection& c, size_t size, Read& read) {
  auto buffer = std::make_shared<std::string>(size, '\0');
  c.server.ReadSome(net::buffer(*buffer), [&read, buffer](boost::system::error_code ec, size_t n) {
    read.ec = ec;
    read.bytes = buffer->substr(0, n);
  });
}

// Runs the loop until `read` has completed (or two seconds have gone by).
void RunUntilDone(Connection& c, const Read& read) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!read.ec && std::chrono::steady_clock::now() < end) {
    c.ioc.restart();  // as RunFor
    c.ioc.run_one_for(std::chrono::milliseconds(10));
  }
}

// A ReadSome of at most `size` bytes, run until it has completed.
Read ReadOnce(Connection& c, size_t size) {
  Read read;
  StartRead(c, size, read);
  RunUntilDone(c, read);
  return read;
}

// A read that took less than it asked for, done: the state in which the
// next read waits for epoll instead of trying first.
void ReadShort(Connection& c) {
  c.Send("abc");
  ASSERT_EQ(ReadOnce(c, 64).bytes, "abc");
}

TEST(ReadSome, ReadsWhatTheSocketHolds) {
  Connection c;
  c.Send("hello");
  const Read read = ReadOnce(c, 64);
  ASSERT_TRUE(read.ec.has_value());
  EXPECT_FALSE(*read.ec);
  EXPECT_EQ(read.bytes, "hello");
}

TEST(ReadSome, AReadThatFillsItsBufferLeavesTheRestForTheNext) {
  Connection c;
  c.Send("0123456789");
  EXPECT_EQ(ReadOnce(c, 4).bytes, "0123");
  EXPECT_EQ(ReadOnce(c, 64).bytes, "456789");
}

TEST(ReadSome, AfterAShortReadWaitsForTheNextBytes) {
  Connection c;
  ReadShort(c);
  Read read;
  StartRead(c, 64, read);
  c.RunFor(std::chrono::milliseconds(50));
  EXPECT_FALSE(read.ec.has_value()) << "completed with nothing sent";
  c.Send("next");
  RunUntilDone(c, read);
  EXPECT_EQ(read.bytes, "next");
}

// The peer's close that comes in the same readiness event as the last
// bytes: the read returns the bytes and leaves the close, which raises no
// event of its own any more. The next read must still end with eof (not
// wait for an event that never comes). Before EPOLLRDHUP was watched, it
// waited: a client that sent its request and shut its side down had no
// answer until the idle timeout.
TEST(ReadSome, APeerCloseThatComesWithTheLastBytesEndsTheNextRead) {
  for (int round = 0; round < 20; ++round) {
    Connection c;
    ReadShort(c);  // drained: the next read waits for epoll
    Read read;
    StartRead(c, 64, read);  // queued, not tried
    c.Send("last");
    c.client.shutdown(tcp::socket::shutdown_send);  // both before the loop looks
    RunUntilDone(c, read);
    ASSERT_EQ(read.bytes, "last") << "round " << round;
    const Read end = ReadOnce(c, 64);
    ASSERT_TRUE(end.ec.has_value()) << "round " << round << ": the peer's close was not seen";
    EXPECT_EQ(*end.ec, net::error::eof);
  }
}

// The race the drained state must not lose: bytes that arrive after the
// short read but before the next read starts raise an epoll event the
// next read is woken by.
TEST(ReadSome, BytesThatArriveBeforeTheNextReadStartsAreNotLost) {
  Connection c;
  ReadShort(c);
  c.Send("early");
  const Read read = ReadOnce(c, 64);
  EXPECT_EQ(read.bytes, "early");
}

// The same, with the loop having seen the event while no read waited: the
// next read tries first again.
TEST(ReadSome, BytesSeenByTheLoopWhileNoReadWaitsAreNotLost) {
  Connection c;
  ReadShort(c);
  c.Send("early");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.ioc.restart();
  c.ioc.poll();
  const Read read = ReadOnce(c, 64);
  EXPECT_EQ(read.bytes, "early");
}

TEST(ReadSome, SaysEofWhenThePeerCloses) {
  Connection c;
  ReadShort(c);
  c.client.shutdown(tcp::socket::shutdown_send);
  const Read read = ReadOnce(c, 64);
  ASSERT_TRUE(read.ec.has_value());
  EXPECT_EQ(*read.ec, net::error::eof);
  EXPECT_EQ(read.bytes, "");
}

TEST(ReadSome, AWaitingReadIsCancelled) {
  Connection c;
  ReadShort(c);
  Read read;
  StartRead(c, 64, read);
  c.RunFor(std::chrono::milliseconds(20));
  c.server.cancel();
  RunUntilDone(c, read);
  ASSERT_TRUE(read.ec.has_value());
  EXPECT_EQ(*read.ec, net::error::operation_aborted);
}

TEST(ReadSome, AReadOnAClosedSocketFails) {
  Connection c;
  c.server.close();
  const Read read = ReadOnce(c, 64);
  ASSERT_TRUE(read.ec.has_value());
  EXPECT_TRUE(*read.ec);
}

// A loop destroyed with a read waiting destroys its handler, unrun (what
// happens to a connection's coroutine at shutdown).
TEST(ReadSome, AWaitingReadIsDestroyedWithItsLoop) {
  auto alive = std::make_shared<int>(0);
  bool ran = false;
  std::array<char, 64> buffer;
  {
    Connection c;
    ReadShort(c);
    c.server.ReadSome(net::buffer(buffer), [alive, &ran](auto, size_t) { ran = true; });
    c.RunFor(std::chrono::milliseconds(20));
    EXPECT_EQ(alive.use_count(), 2);
  }
  EXPECT_EQ(alive.use_count(), 1);
  EXPECT_FALSE(ran);
}

// The point of ReadSome: after a short read, starting the next read makes
// no system call. Counted with the kernel's recvfrom tracepoint for this
// thread; skipped where the kernel does not let the test count.
class SyscallCount {
 public:
  SyscallCount() {
    std::ifstream id_file("/sys/kernel/tracing/events/syscalls/sys_enter_recvfrom/id");
    uint64_t id = 0;
    if (!(id_file >> id)) return;
    perf_event_attr attr{};
    attr.type = PERF_TYPE_TRACEPOINT;
    attr.size = sizeof attr;
    attr.config = id;
    fd_ = static_cast<int>(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
  }
  ~SyscallCount() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  uint64_t Now() const {
    uint64_t n = 0;
    return read(fd_, &n, sizeof n) == sizeof n ? n : UINT64_MAX;
  }

 private:
  int fd_ = -1;
};

TEST(ReadSome, AfterAShortReadTheNextStartsWithoutAReadCall) {
  if (!SLUICE_DRAIN_AWARE_READS) GTEST_SKIP() << "built with Asio's own reads (socket.h)";
  SyscallCount count;
  if (!count.ok()) GTEST_SKIP() << "the recvfrom tracepoint cannot be counted here";
  Connection c;
  ReadShort(c);
  // The count sees this thread's recvfrom calls: one that finds nothing.
  char byte;
  uint64_t before = count.Now();
  ASSERT_EQ(::recv(c.server.native_handle(), &byte, 1, MSG_DONTWAIT), -1);
  ASSERT_EQ(count.Now() - before, 1u);

  Read read;
  before = count.Now();
  StartRead(c, 64, read);
  EXPECT_EQ(count.Now() - before, 0u) << "the read tried the drained socket first";
  c.Send("x");
  RunUntilDone(c, read);
  EXPECT_EQ(read.bytes, "x");
}

TEST(ReadSome, AfterAReadThatFilledItsBufferTheNextTriesFirst) {
  SyscallCount count;
  if (!count.ok()) GTEST_SKIP() << "the recvfrom tracepoint cannot be counted here";
  Connection c;
  c.Send("0123456789");
  ASSERT_EQ(ReadOnce(c, 4).bytes, "0123");
  Read second;
  const uint64_t before = count.Now();
  StartRead(c, 64, second);
  EXPECT_EQ(count.Now() - before, 1u);
  RunUntilDone(c, second);
  EXPECT_EQ(second.bytes, "456789");
}

}  // namespace
}  // namespace sluice::server
