#!/usr/bin/python3
"""PyTorch's file-based timer, measured the way benchmarks/timer_bench measures elastic's.

    /usr/bin/python3 benchmarks/torch_timer_compare.py [--batches N] [--default-trials N]
                                                       [--fast-trials N] [--json FILE]

Needs PyTorch (Debian: apt-get install python3-torch, 1.13). Exits with status 2 if
`import torch` fails. What it measures, with torch.distributed.elastic.timer's FileTimerServer
hosted in this process (as torchrun's agent hosts it) and FileTimerClient in worker processes
forked from it (so the worker does not share a GIL with the server):

  * per-scope cost of `with expires(after=60, scope="step")` in a worker (and of the default
    `scope=None`, which names the scope from inspect.stack()), next to two same-run baselines
    measured in the same worker: an empty `for` iteration and one time.clock_gettime_ns call.
    Scopes are timed in batches of 100 (50 with scope=None) with a pause between batches: the
    client writes each request to the server's FIFO with a non-blocking write, and a tight loop
    overflows the 64 KiB FIFO while the server sleeps (BlockingIOError out of `with expires()`);
    how many scopes a tight loop gets through is reported too;
  * kill latency: a worker enters `expires(after=S)` and hangs; the time from its expiration
    (time.time() + S, as sent to the server) to os.waitpid() here returning it killed by SIGKILL,
    at the server's default max_interval (10 s) and at 0.01 s.

Trials run back to back, as a launcher restarting a hung worker would: each worker starts right
after the server reaped the previous one, i.e. right at the start of a server cycle, so at the
default interval this is close to the worst case (a deadline at a random phase of the 10 s cycle
waits about half as long on average). Total runtime with the defaults: about 95 s.
"""

import argparse
import json
import math
import os
import select
import signal
import statistics
import sys
import tempfile
import threading
import time

try:
    import torch  # noqa: F401
    from torch.distributed.elastic.timer import FileTimerClient, FileTimerServer, expires
except Exception as e:  # pragma: no cover
    print(f"torch_timer_compare: PyTorch is not importable with {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)


class RecordingClient(FileTimerClient):
    """A FileTimerClient that remembers the expiration time it last sent."""

    last_expiration = None

    def acquire(self, scope_id, expiration_time):
        super().acquire(scope_id, expiration_time)
        self.last_expiration = expiration_time


def percentile(sorted_values, p):
    """Nearest rank."""
    if not sorted_values:
        return float("nan")
    k = max(1, min(len(sorted_values), math.ceil(p * len(sorted_values))))
    return sorted_values[k - 1]


def fork_worker(body):
    """Forks a child running body(write_fd); returns (pid, read_fd)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            body(w)
        except BaseException as e:  # report, never return into the parent's code
            try:
                os.write(w, (json.dumps({"error": repr(e)}) + "\n").encode())
            except Exception:
                pass
            code = 1
        os._exit(code)
    os.close(w)
    return pid, r


def read_line(fd, timeout_s):
    buf = b""
    end = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode().split("\n", 1)[0] if buf else None


def kill_and_reap(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def ns_per_iter(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def scope_cost_worker(fifo, batches, pause_s):
    """Times scopes in batches small enough for the FIFO's 64 KiB buffer, pausing between
    batches so the server can drain it: a tight loop of scopes fills the FIFO faster than the
    server reads it, and the client's non-blocking write then raises out of `with expires()`."""

    def body(w):
        client = FileTimerClient(fifo)

        def empty(n):
            for _ in range(n):
                pass

        def clock(n):
            cg = time.clock_gettime_ns
            mono = time.CLOCK_MONOTONIC
            for _ in range(n):
                cg(mono)

        def named(n):
            for _ in range(n):
                with expires(after=60, scope="step", client=client):
                    pass

        def default_scope(n):
            for _ in range(n):
                with expires(after=60, client=client):
                    pass

        out = {}
        for fn, key in ((empty, "empty_loop_ns"), (clock, "clock_gettime_ns")):
            fn(1000)
            out[key] = statistics.median(ns_per_iter(fn, 1_000_000) for _ in range(5))
        # ~190 bytes of requests per named scope, ~2x that with scope=None: 100 and 50 scopes
        # stay well inside 64 KiB.
        for fn, key, n in ((named, "scope_named_ns", 100), (default_scope, "scope_default_ns", 50)):
            per = []
            try:
                fn(10)
                for _ in range(batches):
                    time.sleep(pause_s)
                    per.append(ns_per_iter(fn, n))
                out[key] = statistics.median(per)
                out[key + "_batches"] = f"{batches} x {n}"
            except Exception as e:
                out[key] = statistics.median(per) if per else None
                out[key + "_error"] = repr(e)
        # A tight loop, as a training step loop would run it: how far does it get?
        time.sleep(pause_s)
        done = 0
        try:
            for _ in range(20000):
                with expires(after=60, scope="step", client=client):
                    pass
                done += 1
            out["tight_loop"] = f"{done} scopes without error"
        except Exception as e:
            out["tight_loop"] = f"{type(e).__name__} after {done} scopes: {e}"
        os.write(w, (json.dumps(out) + "\n").encode())

    return body


def hang_worker(fifo, after_s):
    def body(w):
        client = RecordingClient(fifo)
        with expires(after=after_s, scope="hung", client=client):
            os.write(w, f"{client.last_expiration!r}\n".encode())
            while True:
                signal.pause()

    return body


def with_server(max_interval, fn):
    d = tempfile.mkdtemp(prefix="torch-timer-")
    fifo = os.path.join(d, "watchdog")
    server = FileTimerServer(fifo, max_interval=max_interval, daemon=True)
    server.start()
    try:
        return fn(fifo)
    finally:
        server.stop()
        try:
            os.rmdir(d)
        except OSError:
            pass


def measure_scope_cost(fifo, batches, pause_s):
    pid, r = fork_worker(scope_cost_worker(fifo, batches, pause_s))
    try:
        line = read_line(r, 120)
    finally:
        os.close(r)
        kill_and_reap(pid)
    return json.loads(line) if line else {"error": "worker gave no result"}


def measure_scope_cost_in_process(fifo, batches, pause_s):
    """The same named scopes, entered in the server's own process (its thread shares the GIL)."""
    client = FileTimerClient(fifo)
    per = []
    for _ in range(batches):
        time.sleep(pause_s)
        t0 = time.perf_counter_ns()
        for _ in range(100):
            with expires(after=60, scope="step", client=client):
                pass
        per.append((time.perf_counter_ns() - t0) / 100)
    return statistics.median(per)


def machine_busy_s():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")  # not idle, iowait


def self_cpu_s():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure_kill_latency(fifo, after_s, trials):
    """Also reports others_cpu_pct: CPU the rest of the machine used meanwhile (% of one CPU)."""
    lat = []
    busy0, self0, wall0 = machine_busy_s(), self_cpu_s(), time.monotonic()
    for _ in range(trials):
        pid, r = fork_worker(hang_worker(fifo, after_s))
        reaped = False
        try:
            line = read_line(r, 30)
            if line is None or line.startswith("{"):
                raise RuntimeError(f"worker did not enter its scope: {line}")
            expiration = float(line)
            # Block in waitpid, as a launcher would. A guard kills the worker itself if the server
            # has not within 60 s, so a broken server fails the run instead of hanging it.
            guard_fired = []

            def guard_kill():
                guard_fired.append(True)
                os.kill(pid, signal.SIGKILL)

            guard = threading.Timer(max(60.0, after_s + 30), guard_kill)
            guard.start()
            _, status = os.waitpid(pid, 0)
            seen = time.time()
            reaped = True
            guard.cancel()
            if guard_fired:
                raise RuntimeError("the server did not kill the worker within 60 s")
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                raise RuntimeError(f"worker ended with status {status}, not SIGKILL")
            lat.append((seen - expiration) * 1e3)
        finally:
            os.close(r)
            if not reaped:
                kill_and_reap(pid)
    lat.sort()
    others = 100 * ((machine_busy_s() - busy0) - (self_cpu_s() - self0)) / (time.monotonic() - wall0)
    return {"scope_s": after_s, "trials": len(lat), "min_ms": lat[0], "median_ms": statistics.median(lat),
            "p99_ms": percentile(lat, 0.99), "max_ms": lat[-1], "others_cpu_pct": max(0.0, others)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20,
                    help="timed batches of scopes with the 0.01 s server (5 with the 10 s one)")
    ap.add_argument("--default-trials", type=int, default=6, help="kill trials at the default 10 s interval")
    ap.add_argument("--fast-trials", type=int, default=50, help="kill trials per scope length at 0.01 s")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    import torch as _t
    res = {"torch": _t.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count()}
    t_start = time.monotonic()

    def section(title):
        print(f"== {title}  (t={time.monotonic() - t_start:.1f} s)", flush=True)

    section("per-scope cost, server max_interval=0.01 s")
    res["scope_cost_interval_0.01"] = with_server(0.01, lambda f: measure_scope_cost(f, args.batches, 0.05))
    print(json.dumps(res["scope_cost_interval_0.01"]), flush=True)

    section("per-scope cost in the server's process, server max_interval=0.01 s")
    res["scope_named_in_server_process_ns"] = with_server(
        0.01, lambda f: measure_scope_cost_in_process(f, args.batches, 0.05))
    print(json.dumps(res["scope_named_in_server_process_ns"]), flush=True)

    section("per-scope cost, server max_interval=10 s (default)")
    res["scope_cost_interval_10"] = with_server(10, lambda f: measure_scope_cost(f, max(1, args.batches // 4), 1.2))
    print(json.dumps(res["scope_cost_interval_10"]), flush=True)

    section("kill latency, server max_interval=0.01 s")
    res["kill_interval_0.01"] = with_server(
        0.01, lambda f: [measure_kill_latency(f, s, args.fast_trials) for s in (0.02, 0.2)])
    for r in res["kill_interval_0.01"]:
        print(json.dumps(r), flush=True)

    section("kill latency, server max_interval=10 s (default)")
    res["kill_interval_10"] = with_server(10, lambda f: [measure_kill_latency(f, 0.2, args.default_trials)])
    for r in res["kill_interval_10"]:
        print(json.dumps(r), flush=True)

    section("done")
    res["runtime_s"] = time.monotonic() - t_start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)

    # Summary.
    c = res["scope_cost_interval_0.01"]
    print()
    print(f"PyTorch {res['torch']} FileTimer (Python {res['python']}, {res['cpus']} CPUs)")
    if c.get("scope_named_ns"):
        print(f"  with expires(after=60, scope='step'): {c['scope_named_ns'] / 1e3:8.1f} us/scope"
              f"  = {c['scope_named_ns'] / c['clock_gettime_ns']:.0f}x time.clock_gettime_ns"
              f" ({c['clock_gettime_ns']:.0f} ns), {c['scope_named_ns'] / c['empty_loop_ns']:.0f}x empty loop"
              f" ({c['empty_loop_ns']:.1f} ns)")
    print(f"  same, entered in the server's own process: {res['scope_named_in_server_process_ns'] / 1e3:.1f} us/scope")
    if c.get("scope_default_ns"):
        print(f"  with expires(after=60) [scope=None]:  {c['scope_default_ns'] / 1e3:8.1f} us/scope")
    c10 = res["scope_cost_interval_10"]
    if c10.get("scope_named_ns"):
        print(f"  (server at 10 s interval: {c10['scope_named_ns'] / 1e3:.1f} us/scope)")
    else:
        print(f"  (server at 10 s interval: scopes failed: {c10.get('scope_named_ns_error')})")
    print(f"  tight loop of scopes, 0.01 s server: {c.get('tight_loop')}")
    print(f"  tight loop of scopes, 10 s server:   {c10.get('tight_loop')}")
    for key, label in (("kill_interval_0.01", "interval 0.01 s"), ("kill_interval_10", "interval 10 s  ")):
        for r in res[key]:
            print(f"  kill latency, {label}, scope {r['scope_s'] * 1e3:4.0f} ms: median {r['median_ms']:9.1f} ms"
                  f"  p99 {r['p99_ms']:9.1f} ms  max {r['max_ms']:9.1f} ms  ({r['trials']} trials;"
                  f" others used {r['others_cpu_pct']:.0f}% of a CPU)")
    print(f"  runtime {res['runtime_s']:.0f} s")


if __name__ == "__main__":
    main()
