#!/usr/bin/env bash
# What a fixed_window decision costs Redis on a key whose state its INCRBY
# cannot raise (a text state: one an instance with `window_state: text`
# wrote, or a count in debt), against one in the integer form: redis-server
# under valgrind's callgrind, counting only inside `fcallCommand`, while a
# client writes the key's state (this window's, count 1) before each of N
# calls of one decision (the limit in the integer form, in the `INCRBY` path
# after the first call; the writes are not counted). Prints the
# instructions per call for each form.
#
# Like instructions.sh, the count does not move with the machine's load, so
# two builds of the function can be compared by it:
#
#   BENCH=/path/to/other/sluice_bench_redis bench/redis/text_key_cost.sh
#
# Usage: bench/redis/text_key_cost.sh
# Variables: N (calls of each form, 500), BENCH (the benchmark binary, for the
#   function and its arguments; build/release/bench/sluice_bench_redis,
#   built when missing).
# Loopback only; every step is under `timeout`; it stops what it started, by PID.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N=${N:-500}

source scripts/deps.sh
sluice_install_deps valgrind redis-server redis-tools
source bench/lib.sh  # release_binary, work_dir_with_cleanup, start_callgrind_redis
BENCH=$(release_binary "${BENCH:-}" sluice_bench_redis bench/sluice_bench_redis)

work_dir_with_cleanup  # WORK; stops SERVER_PID at exit

echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $BENCH; $N calls of one decision each"
echo "| key's state before each call | instructions per call |"
echo "|---|---:|"
for form in integer text; do
  start_callgrind_redis  # PORT, SERVER_PID
  # The FCALL of one fixed_window decision, one argument a line (it loads
  # the function).
  timeout 60 "$BENCH" --url "redis://127.0.0.1:$PORT" --print-fcall-args \
    --algorithm fixed_window --window-state integer > "$WORK/fcall.txt"
  # 50 calls first, whose count is dropped (callgrind_control -z): the
  # function's first calls parse and keep what later ones reuse.
  timeout 600 python3 - "$PORT" "$form" "$N" "$SERVER_PID" "$WORK/fcall.txt" <<'PY'
import socket, subprocess, sys
port, form, n, pid, fcall = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
args = [a for a in open(fcall).read().split("\n") if a]
key = args[3]  # FCALL name numkeys key ...

def encode(*xs):
    out = b"*%d\r\n" % len(xs)
    for x in xs:
        x = x.encode()
        out += b"$%d\r\n%s\r\n" % (len(x), x)
    return out

conn = socket.create_connection(("127.0.0.1", port), timeout=30)
reader = conn.makefile("rb")

def read():
    line = reader.readline()
    kind = line[:1]
    if kind == b"-":
        raise SystemExit(f"redis: {line.decode().strip()}")
    if kind == b"$":
        size = int(line[1:])
        return None if size < 0 else reader.read(size + 2)[:-2]
    if kind == b"*":
        return [read() for _ in range(max(int(line[1:]), 0))]
    return line[1:].strip()

def command(*xs):
    conn.sendall(encode(*xs))
    return read()

for i in range(n + 50):
    window = int(command("TIME")[0])  # windows of a second: this one
    if form == "text":
        command("SET", key, f"{window} 1")  # "window count"
    else:
        command("SET", key, str(1 * 256 + window % 255 + 1))  # count * 256 + tag
    if i == 49:
        subprocess.run(["callgrind_control", "-z", pid], capture_output=True, timeout=30)
    answer = command(*args)
    if not isinstance(answer, list) or answer[0] != b"0":
        raise SystemExit(f"unexpected answer {answer!r}")
PY
  timeout 30 callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  sleep 0.5
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  # The dump after the zeroing holds the N calls.
  total=$(for f in "$WORK"/callgrind.out.*.*; do awk '/^(summary|totals):/ {print $2; exit}' "$f"; done | sort -n | tail -1)
  echo "| $form | $((total / N)) |"
done
