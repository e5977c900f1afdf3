# Sourced by the benchmark scripts (bench/http/run.sh, bench/redis/run.sh,
# bench/redis/serve.sh), from the repository's root: loopback ports.

# A TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 5 s for something to listen on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2; return 1
}
