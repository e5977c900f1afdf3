# Sourced by scripts/run, scripts/test and scripts/fuzz. The one place that
# names the Debian packages sluice builds and tests with.
#
# sluice_install_deps PACKAGE...: apt-get installs those not yet installed,
# so a second run costs one dpkg query.

SLUICE_BUILD_PACKAGES=(
  clang-14         # the compiler of every preset (CMakePresets.json)
  lld-14           # its linker (CMakeLists.txt: -fuse-ld=lld where found)
  g++ cmake ninja-build pkg-config
  libabsl-dev      # Status/StatusOr, flat_hash_map, Hash
  libcli11-dev     # the command line
  libyaml-cpp-dev  # the config file
  libboost-dev libboost-system-dev  # Asio and Beast: the HTTP server
  libspdlog-dev    # logs
  nlohmann-json3-dev  # the decision API's JSON
  zlib1g-dev       # sluice replay reads gzip access logs
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # the Envoy RLS API
  libhiredis-dev   # the Redis store's client
  libssl-dev       # SHA-256 of over-long keys (libcrypto)
  nodejs npm       # the admin listener's dashboard (web/): npm ci, esbuild (skipped when npm is on PATH)
  libsystemd-dev   # sd_notify: `sluice serve` as a Type=notify systemd service
  libjemalloc-dev  # the sluice binary's allocator (not in the sanitizer builds)
  dpkg-dev file    # cpack's Debian packages: dpkg-shlibdeps finds their dependencies
)
SLUICE_TEST_PACKAGES=(
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  python3          # the integration tests (standard library only)
  nginx-light      # the auth_request end-to-end test
  apache2-bin libapache2-mod-php  # test_apache_paths: Apache with PHP as the upstream
  redis-server redis-tools  # the Redis store's tests run a real server
  openssl          # test_redis_tls makes its certificates with the openssl command
  clang-format     # scripts/format --check: every C++ file follows .clang-format
  chromium chromium-driver python3-selenium  # the dashboard in a real browser (test_dashboard.py)
  systemd          # scripts/test-package: systemd-analyze verify and security on the unit
)
# The asan and tsan presets: the sanitizer runtimes, and libFuzzer (the asan
# preset builds the fuzz targets, scripts/fuzz).
SLUICE_SANITIZER_PACKAGES=(libclang-rt-14-dev libfuzzer-14-dev)

sluice_install_deps() {
  local missing=()
  local p
  for p in "$@"; do
    # A node and npm of its own (from elsewhere than Debian) serve as well:
    # Debian's npm package would conflict with them.
    if [[ "$p" == nodejs || "$p" == npm ]] && command -v node >/dev/null && command -v npm >/dev/null; then
      continue
    fi
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "sluice: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Parallel jobs: all cores, but no more than memory allows (~1.5 GiB per compiler).
sluice_jobs() {
  local cores mem_jobs
  cores=$(nproc)
  mem_jobs=$(awk '/MemAvailable/ {print int($2 / 1500000)}' /proc/meminfo)
  [ "$mem_jobs" -lt 1 ] && mem_jobs=1
  echo $(( cores < mem_jobs ? cores : mem_jobs ))
}
