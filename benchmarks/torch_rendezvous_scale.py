#!/usr/bin/python3
"""torchrun's c10d rendezvous at scale: the baseline for benchmarks/rendezvous_scale.

N agents of torch.distributed.elastic's dynamic rendezvous (DynamicRendezvousHandler over a
C10dRendezvousBackend on one TCPStore, what ``torchrun --rdzv_backend=c10d`` runs) on 127.0.0.1,
with torchrun's default timeouts (join 600 s capped by --cap-s, last call 30 s, heartbeat 5 s).
Per N:

  first round   from the start line until every agent's next_rendezvous() returned
  re-round      SIGKILL one agent (a process of its own), and at the same instant every survivor
                calls next_rendezvous() again (as if its agent had noticed at once: a lower
                bound for torchrun, whose agents notice a failure in their monitor loop), until
                every survivor's call returned

The TCPStore server lives in this driver process, as it would in the first agent. Agents run as
processes up to --max-processes (default 16: each python3 with torch holds ~240 MB), beyond that
as threads in that many processes, each thread its own TCPStore client and handler (the GIL then
shares a process's CPU among its agents; said in the output). The victim always has a process of
its own. Every wait is capped (--cap-s): a size that does not form is "none in X s". A table goes
to stdout, JSON to --out (benchmarks/plot_rendezvous_scale.py reads it).

Run with the system Python, which has Debian's torch (apt-get install python3-torch); exits 2
without it:
  /usr/bin/python3 benchmarks/torch_rendezvous_scale.py [--sizes 4,16,64] [--cap-s 120] [--out F]
Every size runs in its own temporary directory; every agent is SIGKILLed and reaped when the
size ends, on any path.
"""

import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def agent_main(args):
    """One agent process: one handler per id, each on its own thread."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    lock = threading.Lock()

    def say(line):
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    handlers = []
    for ident in args.ids.split(","):
        store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=args.cap_s * 2))
        backend = C10dRendezvousBackend(store, "scale")
        handler = DynamicRendezvousHandler.from_backend(
            run_id="scale",
            store=store,
            backend=backend,
            min_nodes=args.min,
            max_nodes=args.max,
            timeout=RendezvousTimeout(join=timedelta(seconds=args.cap_s * 2)),
        )
        handlers.append((ident, handler))
    say("ready")
    while not os.path.exists(args.go):
        time.sleep(0.001)

    def run(ident, handler):
        try:
            handler.next_rendezvous()
            say(f"round {ident} 1 {time.monotonic_ns()}")
            while not os.path.exists(args.go + ".again"):
                time.sleep(0.001)
            handler.next_rendezvous()
            say(f"round {ident} 2 {time.monotonic_ns()}")
        except Exception as e:  # reported, the driver caps the wait
            say(f"error {ident} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    threads = [threading.Thread(target=run, args=h, daemon=True) for h in handlers]
    for t in threads:
        t.start()
    while True:  # the driver SIGKILLs us
        time.sleep(60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Size:
    """One size: the store, the agent processes and what they said; kill_all() on any exit."""

    def __init__(self, n, args, tmp):
        from datetime import timedelta

        import torch.distributed as dist

        self.port = free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=args.cap_s * 2))
        self.go = os.path.join(tmp, "go")
        procs = min(n, args.max_processes)
        groups = [[] for _ in range(procs)]
        for i in range(n):
            g = min(i, procs - 1) if i < 1 or procs <= 1 else 1 + (i - 1) % (procs - 1)
            groups[g].append(f"a{n - 1 - i:04}")
        self.groups = groups
        self.procs = []
        self.lines = {}
        self.ready = set()
        self.rounds = {}  # (id, round) -> t_ns
        self.errors = []
        self.sel = selectors.DefaultSelector()
        for i, g in enumerate(groups):
            p = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--agent", "--port", str(self.port),
                 "--ids", ",".join(g), "--go", self.go, "--min", str(max(1, n - 2)), "--max", str(n),
                 "--cap-s", str(args.cap_s)],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
            os.set_blocking(p.stdout.fileno(), False)
            self.sel.register(p.stdout, selectors.EVENT_READ, i)
            self.procs.append(p)
            self.lines[i] = b""

    def drain(self, timeout):
        for key, _ in self.sel.select(timeout):
            i = key.data
            try:
                data = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                continue
            if not data:
                self.sel.unregister(key.fileobj)
                continue
            self.lines[i] += data
            *full, self.lines[i] = self.lines[i].split(b"\n")
            for line in full:
                words = line.decode(errors="replace").split()
                if not words:
                    continue
                if words[0] == "ready":
                    self.ready.add(i)
                elif words[0] == "round":
                    self.rounds[(words[1], int(words[2]))] = int(words[3])
                elif words[0] == "error" and len(self.errors) < 3:
                    self.errors.append(" ".join(words))

    def wait(self, cap_s, done):
        until = time.monotonic() + cap_s
        while not done():
            left = until - time.monotonic()
            if left <= 0:
                return False
            self.drain(min(left, 0.05))
        return True

    def reached(self, round_, ids):
        ts = [self.rounds[(i, round_)] for i in ids if (i, round_) in self.rounds]
        return len(ts), (max(ts) if ts else 0)

    def kill_all(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()
            p.stdout.close()
        self.sel.close()


def measure(n, args):
    res = {"n": n, "first_round_s": None, "reround_s": None, "note": ""}
    with tempfile.TemporaryDirectory(prefix="torch-rdzv-") as tmp:
        size = Size(n, args, tmp)
        try:
            res["processes"] = len(size.procs)
            res["max_per_process"] = max(len(g) for g in size.groups)
            if not size.wait(max(120, args.cap_s), lambda: len(size.ready) == len(size.procs)):
                res["note"] = "agents did not start"
                return res
            everyone = [i for g in size.groups for i in g]
            t0 = time.monotonic_ns()
            open(size.go, "w").close()
            if not size.wait(args.cap_s, lambda: size.reached(1, everyone)[0] == n):
                res["note"] = f"{size.reached(1, everyone)[0]} of {n} had a round after {args.cap_s:.0f} s"
                return res
            res["first_round_s"] = (size.reached(1, everyone)[1] - t0) / 1e9
            size.wait(2, lambda: False)
            survivors = [i for g in size.groups[1:] for i in g]
            t = time.monotonic_ns()
            os.killpg(size.procs[0].pid, signal.SIGKILL)
            open(size.go + ".again", "w").close()
            if size.wait(args.cap_s, lambda: size.reached(2, survivors)[0] == len(survivors)):
                res["reround_s"] = (size.reached(2, survivors)[1] - t) / 1e9
            else:
                res["note"] = f"re-round: {size.reached(2, survivors)[0]} of {len(survivors)} after {args.cap_s:.0f} s"
        finally:
            if size.errors:
                res["note"] = (res["note"] + " " + size.errors[0]).strip()
            size.kill_all()
    return res


def show(v, cap):
    if v is None:
        return f"none in {cap:.0f} s"
    return f"{v:.2f} s" if v < 10 else f"{v:.1f} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    ap.add_argument("--min", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--max", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="4,16,64,128,256")
    ap.add_argument("--cap-s", type=float, default=120.0)
    ap.add_argument("--max-processes", type=int, default=16)
    ap.add_argument("--label", default="")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.agent:
        agent_main(args)
        return 0
    try:
        import torch  # noqa: F401
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler  # noqa: F401
    except ImportError as e:
        print(f"torch_rendezvous_scale: torch does not import ({e}); apt-get install python3-torch", file=sys.stderr)
        return 2
    import torch

    args.max_processes = max(2, args.max_processes)
    print(f"torch_rendezvous_scale: torch {torch.__version__}, c10d rendezvous, cap {args.cap_s:.0f} s, "
          f"{os.cpu_count()} CPUs; {args.label}", flush=True)
    print(f"{'N':>6}  {'layout':<18}  {'first round':<14}  {'re-round after a kill':<22}", flush=True)
    results = []
    interrupted = []

    def on_term(*_):
        raise KeyboardInterrupt  # unwinds through measure(), which kills and reaps its agents

    signal.signal(signal.SIGTERM, on_term)
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            r = measure(n, args)
            layout = (f"{r.get('processes', 0)} procs" if r.get("max_per_process", 1) <= 1
                      else f"{r.get('processes', 0)} procs <={r['max_per_process']} thr")
            print(f"{n:>6}  {layout:<18}  {show(r['first_round_s'], args.cap_s):<14}  "
                  f"{show(r['reround_s'], args.cap_s) if r['first_round_s'] is not None else '-':<22}", flush=True)
            if r["note"]:
                print(f"        note: {r['note']}", flush=True)
            results.append(r)
    except KeyboardInterrupt:
        interrupted.append(1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "torch_rendezvous_scale", "label": args.label, "torch": torch.__version__,
                       "cap_s": args.cap_s, "cpus": os.cpu_count(), "results": results}, f)
            f.write("\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
