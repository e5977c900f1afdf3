"""What the HTTP benchmark scripts read of the processes they start (and
a free loopback port to start them on): CPU time and peak RSS from /proc,
summed over a process and its children (NGINX's workers)."""

import os
import socket
import subprocess

HOST = "127.0.0.1"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def processes(pid):
    """`pid` and its children (NGINX's workers)."""
    pids = [pid]
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def cpu_seconds(pid):
    """User and system CPU seconds of `pid` and its children."""
    total = 0
    for p in processes(pid):
        with open("/proc/%d/stat" % p) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def peak_rss_kib(pid):
    """Peak RSS (VmHWM) of `pid` and its children, summed."""
    total = 0
    for p in processes(pid):
        with open("/proc/%d/status" % p) as f:
            total += int([l for l in f if l.startswith("VmHWM")][0].split()[1])
    return total


def stop(proc):
    """Ends `proc` (SIGTERM, then SIGKILL after 10 s) and waits for it."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
