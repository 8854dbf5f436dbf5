#!/usr/bin/python3
"""examples/torch_mnist.cpp's trainer the usual PyTorch way, for the README's side-by-side:
torchrun restarts every worker when one dies, DistributedDataParallel averages the gradients,
and a checkpoint (torch.distributed.checkpoint where the installed PyTorch has it, 2.0 and later;
torch.save by rank 0 before) is what a restart resumes from.

  torchrun --nproc-per-node 4 --max-restarts 3 examples/torch_mnist_torchrun.py \\
      --data mnist --ckpt ckpt [--kill-rank R --kill-at S]

Reads the MNIST-format files torch_mnist writes (run it once first, or give the real ones).
Prints "finished at step N" from rank 0; --kill-rank R --kill-at S SIGKILLs rank R in step S,
once per checkpoint directory (a file beside it remembers); --trace FILE records the kill's time
and each step's end (rank 0), from which benchmarks/torch_mnist_compare.sh reads how long the
job took to train again.
"""
import argparse
import os
import signal
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import torch.distributed.checkpoint as dcp  # PyTorch >= 2.0
except ImportError:
    dcp = None


def idx(path):
    with open(path, "rb") as f:
        magic, n = np.frombuffer(f.read(8), ">u4")
        shape = (n, 784) if magic == 2051 else (n,)
        if magic == 2051:
            f.read(8)
        return np.frombuffer(f.read(), np.uint8).reshape(shape)


def trace(a, line):
    if a.trace:
        with open(a.trace, "a") as f:
            f.write(line + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="mnist")
    p.add_argument("--ckpt", default="mnist-ckpt-py")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--trace", default="", help="append 'kill T' and rank 0's 'step S T RESTART' (time.monotonic) here")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.from_numpy(idx(f"{a.data}/train-images-idx3-ubyte").astype(np.float32) / 255)
    y = torch.from_numpy(idx(f"{a.data}/train-labels-idx1-ubyte").astype(np.int64))

    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    os.makedirs(a.ckpt, exist_ok=True)
    if os.path.exists(f"{a.ckpt}/done"):  # resume from the newest checkpoint
        if dcp:
            dcp.load_state_dict(state, dcp.FileSystemReader(a.ckpt))
        else:
            state = torch.load(f"{a.ckpt}/state.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    step = state["step"]

    g = torch.Generator().manual_seed(7)
    order = torch.randperm(len(y), generator=g)
    per_rank = a.global_batch // world
    while step < a.steps:
        at = (step * a.global_batch) % len(y)
        rows = order[at + rank * per_rank: at + (rank + 1) * per_rank]
        opt.zero_grad()
        F.cross_entropy(ddp((x[rows] - 0.1307) / 0.3081), y[rows]).backward()  # DDP averages here
        if rank == a.kill_rank and step == a.kill_at:
            mark = f"{a.ckpt}.killed-{rank}"
            if not os.path.exists(mark):
                open(mark, "w").close()
                trace(a, f"kill {time.monotonic():.6f}")
                os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        step += 1
        if rank == 0:
            trace(a, f"step {step} {time.monotonic():.6f} {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
        if step % a.every == 0 or step == a.steps:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            if dcp:
                dcp.save_state_dict(state, dcp.FileSystemWriter(a.ckpt))
            elif rank == 0:
                torch.save(state, f"{a.ckpt}/state.tmp")
                os.replace(f"{a.ckpt}/state.tmp", f"{a.ckpt}/state.pt")
            dist.barrier()
            if rank == 0:
                open(f"{a.ckpt}/done", "w").close()
    if rank == 0:
        print(f"finished at step {step} ({time.monotonic():.3f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
