// What the tests of the gRPC listener share (rls_server_test.cc,
// connection_gate_test.cc): certificates made by the openssl command, and
// this process's threads by name.
#ifndef SLUICE_ENVOY_GRPC_TEST_SUPPORT_H_
#define SLUICE_ENVOY_GRPC_TEST_SUPPORT_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace sluice::envoy {

// How many of this process's threads have the name `name` (comm).
inline int ThreadsNamed(std::string_view name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

// Certificates made by the openssl command in a folder of their own: an
// authority ("ca") signing the server's ("server", for localhost) and a
// client's ("client", for envoy.test), and another authority ("other") signing a client's
// ("stranger").
class TestCertificates {
 public:
  TestCertificates() {
    char path[] = "/tmp/sluice-rls-tls-XXXXXX";
    if (mkdtemp(path) == nullptr) return;
    dir_ = path;
    ok_ = Authority("ca") && Authority("other") &&
          Signed("server", "ca", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth") &&
          Signed("client", "ca", "subjectAltName=DNS:envoy.test\nextendedKeyUsage=clientAuth") &&
          Signed("stranger", "other", "extendedKeyUsage=clientAuth");
  }
  ~TestCertificates() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool ok() const { return ok_; }
  std::string Path(const std::string& name, const std::string& ext) const {
    return dir_ + "/" + name + "." + ext;
  }
  std::string Text(const std::string& name, const std::string& ext) const {
    std::ifstream in(Path(name, ext));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  bool Run(const std::string& args) const {
    return std::system(("cd " + dir_ + " && openssl " + args + " >/dev/null 2>&1").c_str()) == 0;
  }
  bool Authority(const std::string& name) const {
    return Run("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + name +
               ".key -out " + name + ".pem -days 2 -subj '/CN=sluice test " + name + "'");
  }
  bool Signed(const std::string& name, const std::string& ca, const std::string& ext) const {
    std::ofstream(Path(name, "ext")) << ext << "\n";
    return Run("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + name +
               ".key -out " + name + ".csr -subj /CN=" + name) &&
           Run("x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca +
               ".key -CAcreateserial -days 2 -extfile " + name + ".ext -out " + name + ".pem");
  }
  std::string dir_;
  bool ok_ = false;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_GRPC_TEST_SUPPORT_H_
