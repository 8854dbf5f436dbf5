#!/usr/bin/python3
"""The cost of one timer scope in a Python worker: elastic_timer beside torch's timer servers.

    elastic-run --nproc-per-node 1 --python /usr/bin/python3 benchmarks/python_timer_bench.py [--scopes N] [--json FILE]

Run it under elastic-run (its watchdog's table is what elastic_timer writes to; PYTHONPATH must
reach python/). Each row is the mean time of one `with ...: pass`, measured in this process, in
the same run, next to an empty loop iteration (the floor):

  * elastic_timer.expires(after=60, scope="step"): the package's own context manager;
  * torch's timer.expires(after=60, scope="step") with timer.configure(elastic_timer.TimerClient()):
    torch's context manager, elastic's client (what an unmodified torch script gets);
  * torch's expires with LocalTimerClient: a multiprocessing queue to a LocalTimerServer in a
    process forked before, as torchrun's agent hosts it;
  * torch's expires with FileTimerClient: a FIFO to a FileTimerServer (a thread here, as
    torchrun's agent hosts it). Its FIFO overflows when written in a tight loop while the server
    sleeps, so its scopes run in batches of 100 with a pause between (only the scopes are timed).

Needs Debian's python3-torch (1.13) under /usr/bin/python3; exits 2 without it.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

try:
    import torch  # noqa: F401
    import torch.distributed.elastic.timer as timer
    from torch.distributed.elastic.timer import FileTimerClient, FileTimerServer, LocalTimerClient, LocalTimerServer
except Exception as e:  # pragma: no cover
    print(f"python_timer_bench: PyTorch is not importable with {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)
import elastic_timer


def per_scope(body, n, batch=None, pause=0.0):
    """Mean seconds of one call of body(), in batches of `batch` with `pause` between."""
    batch = batch or n
    spent, done = 0.0, 0
    while done < n:
        k = min(batch, n - done)
        t0 = time.perf_counter()
        for _ in range(k):
            body()
        spent += time.perf_counter() - t0
        done += k
        if pause:
            time.sleep(pause)
    return spent / n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scopes", type=int, default=20000)
    p.add_argument("--json")
    a = p.parse_args()
    if not os.environ.get("ELASTIC_WATCHDOG"):
        print("python_timer_bench: run it under elastic-run (ELASTIC_WATCHDOG is not set)", file=sys.stderr)
        return 2
    n = a.scopes
    rows = []

    def empty():
        pass

    rows.append(("empty loop iteration (floor)", per_scope(empty, n)))

    ours = elastic_timer.TimerClient()
    assert ours.watched

    def elastic_cm():
        with elastic_timer.expires(after=60, scope="step", client=ours):
            pass

    rows.append(("elastic_timer.expires", per_scope(elastic_cm, n)))

    def torch_cm():
        with timer.expires(after=60, scope="step"):
            pass

    timer.configure(ours)
    rows.append(("torch expires + elastic_timer.TimerClient", per_scope(torch_cm, n)))

    q = mp.get_context("fork").Queue()
    server = LocalTimerServer(q, max_interval=0.1)
    server.start()
    timer.configure(LocalTimerClient(q))
    rows.append(("torch expires + LocalTimerServer (mp queue)", per_scope(torch_cm, n)))
    server.stop()
    q.cancel_join_thread()  # requests the stopped server never read: exit would wait on them forever

    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "timer.fifo")
        fserver = FileTimerServer(fifo, max_interval=0.1)
        fserver.start()
        timer.configure(FileTimerClient(fifo))
        rows.append(("torch expires + FileTimerServer (FIFO)", per_scope(torch_cm, min(n, 5000), batch=100, pause=0.2)))
        fserver.stop()

    floor = rows[0][1]
    ref = rows[1][1]
    print(f"{'per scope':46} {'us':>9} {'x elastic_timer':>16}")
    for name, s in rows:
        print(f"{name:46} {s * 1e6:9.2f} {s / ref:16.1f}")
    print(f"(the floor, an empty iteration: {floor * 1e9:.0f} ns; {n} scopes per row, FIFO {min(n, 5000)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"scopes": n, "rows": [{"name": k, "seconds": v} for k, v in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
