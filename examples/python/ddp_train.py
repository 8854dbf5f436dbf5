"""An unmodified-style torch DDP script (CPU, Gloo) that checkpoints with torch.save and resumes.

What torchrun users write: init_process_group("env://"), DistributedDataParallel, a checkpoint
every few steps written by rank 0, loaded by every rank at the start. Under elastic-run (or
torchrun) it survives a killed or hung worker: every worker restarts from the newest checkpoint.
Its step is guarded by torch's expiration timer, served by elastic's watchdog through
elastic_timer (python/), when that package is importable.

    elastic-run --nproc-per-node 4 examples/python/ddp_train.py --steps 60 --ckpt /tmp/ckpt

Fault injection for the tests (environment, first life only, TORCHELASTIC_RESTART_COUNT=0):
HANG_AT_STEP=S with HANG_RANK=R hangs rank R at step S inside its timer scope.
"""
import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.elastic.timer as timer
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import elastic_timer
except ImportError:  # not installed: the steps are not guarded
    elastic_timer = None


def batch(step, rank, world, n=64):
    # Depends on the step only: every world size trains on the same samples.
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 32, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    per = n // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def save(path, step, model, opt):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--step-timeout", type=float, default=10.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if os.path.exists(a.ckpt):
        state = torch.load(a.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = DDP(model)
    if elastic_timer is not None:
        timer.configure(elastic_timer.TimerClient())
    print(f"rank {rank}/{world} restart {restart}: resuming at step {start}", flush=True)
    hang_at = int(os.environ.get("HANG_AT_STEP", "-1"))
    for step in range(start, a.steps):
        guard = timer.expires(after=a.step_timeout, scope="train_step") if elastic_timer else _nothing()
        with guard:
            if step == hang_at and restart == 0 and str(rank) == os.environ.get("HANG_RANK", "0"):
                print(f"rank {rank}: hanging at step {step}", flush=True)
                while True:
                    time.sleep(1)
            x, y = batch(step, rank, world)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            time.sleep(a.step_time)
        done = step + 1
        if rank == 0 and (done % a.every == 0 or done == a.steps):
            save(a.ckpt, done, model, opt)
            print(f"step {done}: loss {loss.item():.4f}, checkpoint saved", flush=True)
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values())).hexdigest()
    print(f"rank {rank}: done at step {a.steps}, weights {digest[:16]}", flush=True)
    dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
