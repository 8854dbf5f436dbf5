#!/usr/bin/python3
"""How long torchrun takes to get a 4-worker Gloo job training again after one worker dies.

torchrun (PyTorch 1.13: ``python3 -m torch.distributed.run``) handles a dead worker by stopping
every worker of the group, running a new rendezvous and starting them all again
(``--max_restarts``). This script measures that, the baseline for elastic's in-process recovery
(``benchmarks/recovery_bench``):

  1. torchrun starts 4 workers on one host (c10d rendezvous on 127.0.0.1, a free port). Each
     worker writes ``start`` when its process begins, initialises a Gloo process group, then runs
     allreduce steps (a 1000-float tensor, 10 ms apart) and appends one line per completed step
     to its file, stamped with ``time.monotonic_ns()`` (CLOCK_MONOTONIC, system-wide, so stamps
     from different processes compare).
  2. Once every rank has completed 20 steps, and after a further random delay (uniform over one
     monitor interval, so the kill falls at a random phase of the agent's monitoring loop
     instead of the same phase in every trial), the script SIGKILLs rank 1.
  3. It waits for the restarted group (TORCHELASTIC_RESTART_COUNT = 1) to complete its first
     allreduce step on all 4 ranks, then asks the workers to stop and reaps everything.

Reported per trial, from the kill (all in ms):
  detect+stop+rdzv  kill -> the first restarted worker process begins
  all_started       kill -> the last of the 4 restarted workers begins
  first_step_any    kill -> the first rank completes an allreduce in the restarted group
  first_step_all    kill -> every rank has completed one (the figure compared with elastic)

Each setting (the default --monitor_interval, 5 s in 1.13, and 0.1 s) runs N trials; the script
prints the median and max per setting and, last, one JSON line with everything.

Run with the system Python, which has Debian's torch (python3-torch); exits 2 without it:
  /usr/bin/python3 benchmarks/torchrun_restart.py [--trials 5] [--json out.json]

--backend nccl runs the same job on GPU 0 with NCCL (a PyTorch built for CUDA, e.g. a GPU machine's
python3 with torch 2.11+cu130): the 4 workers share the GPU, each its own NCCL_HOSTID, so NCCL
accepts four ranks on one GPU and talks NET/Socket over loopback, as elastic's NCCL scenarios do
(tests/test_nccl_group.cpp, scripts/gpu_check.sh). --intervals picks the monitor intervals
(default: "default,0.1").
Every trial runs in its own temporary directory and process group under a deadline; whatever is
left when a trial ends (or fails) is SIGKILLed and reaped.
"""

import argparse
import json
import random
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORLD = 4
VICTIM = 1
STEPS_BEFORE_KILL = 20
STEP_PERIOD_S = 0.01
DEFAULT_MONITOR_INTERVAL_S = 5.0  # torch/distributed/run.py, --monitor_interval, in 1.13


# ---------------------------------------------------------------------------------------------
# Worker side: runs under torchrun.
def worker(out_dir, backend):
    start_ns = time.monotonic_ns()  # before importing torch: process start as seen by the user
    rank = int(os.environ["RANK"])
    if backend == "nccl":
        # Four ranks on one GPU: NCCL refuses two ranks of one host on one GPU, so each rank is a
        # host of its own (NCCL reads this when the communicator is made, after this line).
        os.environ["NCCL_HOSTID"] = f"torchrun-restart-host{rank}"
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    path = os.path.join(out_dir, f"rank{rank}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(what, step=-1):
        os.write(fd, f"{restart} {rank} {os.getpid()} {what} {step} {time.monotonic_ns()}\n".encode())

    os.write(fd, f"{restart} {rank} {os.getpid()} start -1 {start_ns}\n".encode())
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(0)
        device = "cuda"
    dist.init_process_group(backend, timeout=__import__("datetime").timedelta(seconds=30))
    note("init")
    stop = os.path.join(out_dir, "stop")
    t = torch.ones(1000, device=device)
    step = 0
    deadline = time.monotonic() + 120  # a worker never outlives a lost orchestrator by much
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        note("step", step)
        step += 1
        # Everyone decides to stop at the same step: rank 0 broadcasts the stop flag.
        flag = torch.tensor([1 if (rank == 0 and os.path.exists(stop)) else 0], device=device)
        dist.broadcast(flag, 0)
        if flag.item():
            break
        time.sleep(STEP_PERIOD_S)
    dist.destroy_process_group()
    os.close(fd)


# ---------------------------------------------------------------------------------------------
# Orchestrator side.
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_lines(out_dir):
    rows = []
    for r in range(WORLD):
        p = os.path.join(out_dir, f"rank{r}.log")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 6:
                    continue  # a line being written
                restart, rank, pid, what, step, ns = parts
                rows.append((int(restart), int(rank), int(pid), what, int(step), int(ns)))
    return rows


def wait_for(pred, proc, timeout_s, what, log):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            raise RuntimeError(f"torchrun exited ({proc.returncode}) while waiting for {what}; "
                               f"its log ends:\n{tail(log)}")
        time.sleep(0.002)
    raise TimeoutError(f"no {what} within {timeout_s} s; torchrun's log ends:\n{tail(log)}")


def tail(path, chars=3000):
    with open(path, errors="replace") as f:
        return f.read()[-chars:]


def trial(monitor_interval, index, timeout_s, backend):
    with tempfile.TemporaryDirectory(prefix="torchrun-restart-") as tmp:
        port = free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run",
               "--nnodes", "1", "--nproc_per_node", str(WORLD),
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
               "--rdzv_id", f"restart-bench-{os.getpid()}-{index}",
               "--max_restarts", "3",
               # torch 1.13 on Python 3.11: Std.from_str("0"), the default of both options,
               # returns None (3.11's Flag iteration skips the zero member) and torchrun fails
               # in to_map(); single-bit values work: stdout to a file, stderr teed.
               "--redirects", "1", "--tee", "2", "--log_dir", os.path.join(tmp, "logs")]
        if monitor_interval is not None:
            cmd += ["--monitor_interval", str(monitor_interval)]
        cmd += [os.path.abspath(__file__), "--worker", tmp, backend]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if backend == "nccl":
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_IB_DISABLE", "1")
            # Workers that share the launcher's rendezvous store (torch's default since 2.5) may
            # read the previous attempt's NCCL unique id after a restart and connect to a dead
            # root ("socketPollConnect ... Connection refused": pytorch/pytorch#135712, #167288);
            # torch's own workaround, which a user restarting NCCL jobs under torchrun needs.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        log_path = os.path.join(tmp, "torchrun.log")
        with open(log_path, "w") as log:
            # Own session: every worker is in torchrun's process group, killed with it on failure.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        try:
            def ready():
                rows = read_lines(tmp)
                per_rank = {}
                for restart, rank, pid, what, step, ns in rows:
                    if restart == 0 and what == "step" and step >= STEPS_BEFORE_KILL - 1:
                        per_rank[rank] = pid
                return per_rank if len(per_rank) == WORLD else None

            pids = wait_for(ready, proc, timeout_s, "20 steps on every rank", log_path)
            time.sleep(random.uniform(0, monitor_interval or DEFAULT_MONITOR_INTERVAL_S))
            kill_ns = time.monotonic_ns()
            os.kill(pids[VICTIM], signal.SIGKILL)

            def restarted():
                rows = [r for r in read_lines(tmp) if r[0] >= 1]
                firsts = {}
                for restart, rank, pid, what, step, ns in rows:
                    if what == "step" and rank not in firsts:
                        firsts[rank] = ns
                if len(firsts) < WORLD:
                    return None
                starts = [ns for (_, _, _, what, _, ns) in rows if what == "start"]
                inits = [ns for (_, _, _, what, _, ns) in rows if what == "init"]
                return starts, inits, firsts

            starts, inits, firsts = wait_for(restarted, proc, timeout_s,
                                             "a completed step of the restarted group", log_path)
            open(os.path.join(tmp, "stop"), "w").close()
            rc = proc.wait(timeout=timeout_s)
            if rc != 0:
                raise RuntimeError(f"torchrun exited {rc}; its log ends:\n{tail(log_path)}")
            ms = lambda ns: (ns - kill_ns) / 1e6
            return {"first_start": ms(min(starts)), "all_started": ms(max(starts)),
                    "all_initialised": ms(max(inits)),
                    "first_step_any": ms(min(firsts.values())),
                    "first_step_all": ms(max(firsts.values()))}
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            else:
                # torchrun is gone; anything left of its group goes too.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def main():
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "gloo")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5, help="trials per setting (default 5)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds each phase of a trial may take")
    ap.add_argument("--json", help="also write the JSON result to this file")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                    help="the process group's backend (nccl: GPU 0, a torch built for CUDA)")
    ap.add_argument("--intervals", default="default,0.1",
                    help='monitor intervals to run, comma-separated seconds or "default" (default: "default,0.1")')
    args = ap.parse_args()
    try:
        import torch  # noqa: F401  (only to fail early and clearly)
    except ImportError as e:
        print(f"torch cannot be imported ({e}); use /usr/bin/python3 with python3-torch", file=sys.stderr)
        return 2

    import torch
    if args.backend == "nccl" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device: --backend nccl needs one", file=sys.stderr)
        return 2
    settings = []
    for v in args.intervals.split(","):
        v = v.strip()
        settings.append(("default (5 s)", None) if v == "default" else (f"{float(v):g} s", float(v)))
    keys = ["first_start", "all_started", "all_initialised", "first_step_any", "first_step_all"]
    result = {"torch": torch.__version__, "backend": args.backend, "world": WORLD, "trials": args.trials,
              "step_period_ms": STEP_PERIOD_S * 1000, "nproc": os.cpu_count(),
              "loadavg": os.getloadavg()[0], "settings": {}}
    for name, interval in settings:
        runs = []
        for i in range(args.trials):
            r = trial(interval, i, args.timeout, args.backend)
            runs.append(r)
            print(f"monitor_interval {name:14} trial {i}: " +
                  "  ".join(f"{k} {r[k]:8.1f} ms" for k in keys), flush=True)
        summary = {k: {"median_ms": statistics.median(r[k] for r in runs),
                       "max_ms": max(r[k] for r in runs)} for k in keys}
        result["settings"][name] = {"monitor_interval_s": interval or DEFAULT_MONITOR_INTERVAL_S,
                                    "summary": summary, "trials": runs}
        print(f"monitor_interval {name}: kill -> restarted group's first step on all ranks: "
              f"median {summary['first_step_all']['median_ms']:.1f} ms, "
              f"max {summary['first_step_all']['max_ms']:.1f} ms "
              f"(workers started after median {summary['first_start']['median_ms']:.1f} ms)", flush=True)
    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
