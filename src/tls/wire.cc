#include "tls/wire.h"

#include <sys/socket.h>

#include <cerrno>

namespace sluice::tls {
namespace {

int WireRead(BIO* bio, char* out, int size) {
  auto* wire = static_cast<Wire*>(BIO_get_data(bio));
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
  auto* wire = static_cast<Wire*>(BIO_get_data(bio));
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

BIO* NewWireBio(Wire* wire) {
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

}  // namespace sluice::tls
