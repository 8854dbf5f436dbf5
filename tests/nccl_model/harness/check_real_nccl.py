#!/usr/bin/env python3
"""Runs the NCCL model's probe scenarios against REAL CUDA and NCCL on a GPU machine, to check the
model's claims (tests/nccl_model/README.md, "Checked against real NCCL").

    g++ -std=c++20 -O1 -I/usr/local/cuda/include -Itests/nccl_model/include tests/nccl_model/harness/probe_*.cpp \\
        tests/nccl_model/harness/real_stubs.cpp -L/usr/local/cuda/lib64 -lcudart -lnccl -ldl -lpthread -o probe_real
    python3 tests/nccl_model/harness/check_real_nccl.py ./probe_real

Prints each scenario's lines as the probe printed them. Only what a real GPU can do is run: no fault
injection, no contract checks (those are the model's own), one GPU.
"""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

PROBE = sys.argv[1]
BASE_ENV = dict(os.environ, NCCL_SOCKET_IFNAME=os.environ.get("NCCL_SOCKET_IFNAME", "lo"))


class Probe:
    def __init__(self, args, env=None):
        e = dict(BASE_ENV)
        e.update(env or {})
        self.p = subprocess.Popen([PROBE] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=e, text=True)
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._pump, args=(self.p.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.p.stderr, self.err.append), daemon=True).start()

    @staticmethod
    def _pump(f, put):
        for line in f:
            put(line.rstrip("\n"))
        put(None)

    def line(self, timeout=60):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def until(self, prefix, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            line = self.line(max(0.1, end - time.time()))
            if line is None:
                return None
            print("   ", line)
            if line.startswith(prefix):
                return line
        return None

    def rest(self, timeout=90):
        end = time.time() + timeout
        while time.time() < end:
            line = self.line(max(0.1, end - time.time()))
            if line is None or line == "done":
                print("   ", line)
                return
            print("   ", line)

    def say(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def finish(self, timeout=60):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "timeout"
        errs = [l for l in self.err if l and "NCCL INFO" not in l][-8:]
        print("    exit:", rc, *("\n    stderr: " + l for l in errs))


def new_id():
    p = Probe(["make-id"])
    line = p.line(60)
    return p, line.split()[1]


def scenario(title):
    print("==", title, flush=True)


def single(name, env=None):
    scenario(name)
    p = Probe([name], env)
    p.rest()
    p.finish()


def ranks(n, args, env_of):
    holder, ident = new_id()
    procs = [Probe(args + ["id=" + ident, "rank=%d" % r, "nranks=%d" % n, "device=0"], env_of(r)) for r in range(n)]
    return holder, procs


def main():
    single("version")
    single("init-nonblocking")
    single("arguments")
    single("cuda-semantics")
    single("async-launch")
    scenario("device-dereference")
    p = Probe(["device-dereference"])
    p.rest(30)
    p.finish()

    scenario("collectives: 2 ranks, 2 host ids, 1 GPU")
    holder, procs = ranks(2, ["collectives"], lambda r: {"NCCL_HOSTID": "host-%d" % r})
    outs = []
    for p in procs:
        lines = []
        while True:
            line = p.line(120)
            if line is None or line == "done":
                break
            lines.append(line)
        outs.append(lines)
        p.finish()
    print("    checks:", [l for l in outs[0] if l.startswith("check") or l.startswith("FAIL")])
    print("    ranks agree bit for bit:", outs[0] == outs[1], "lines:", len(outs[0]))
    holder.kill()

    scenario("duplicate GPU: 2 ranks, one host id, 1 GPU")
    holder, procs = ranks(2, ["init"], lambda r: {"NCCL_HOSTID": "same"})
    for p in procs:
        p.rest()
        p.finish()
    holder.kill()

    scenario("peer death, other host (NET/Socket)")
    holder, procs = ranks(2, ["peer-death", "mode=net"], lambda r: {"NCCL_HOSTID": "host-%d" % r})
    for p in procs:
        p.until("ready", 120)
    procs[0].until("enqueued", 30)
    procs[1].kill()
    procs[0].say("killed")
    procs[0].rest(120)
    procs[0].finish()
    holder.kill()

    scenario("shrink with exclude lists that differ: ranks 0, 1 exclude 3, rank 2 excludes 0 and 3")
    holder, ident = new_id()
    procs = [Probe(["shrink-mismatch", "id=" + ident, "rank=%d" % r, "nranks=4", "device=0",
                    "exclude=" + ("0,3" if r == 2 else "3"), "wait_ms=15000"], {"NCCL_HOSTID": "host-%d" % r})
             for r in range(4)]
    for p in procs:
        p.until("ready", 120)
    for p in procs[:3]:
        p.rest(60)
        p.finish()
    procs[3].kill()
    holder.kill()

    scenario("shrink 4 -> 3, 4 host ids, 1 GPU")
    holder, procs = ranks(4, ["shrink", "victim=3"], lambda r: {"NCCL_HOSTID": "host-%d" % r})
    for p in procs:
        p.until("ready", 120)
    procs[3].kill()
    for p in procs[:3]:
        p.say("go")
    for p in procs[:3]:
        p.rest(120)
        p.finish()
    holder.kill()


if __name__ == "__main__":
    main()
