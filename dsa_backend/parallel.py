"""Tensor parallelism: one process a GPU, each holding a shard of every layer's heads and hidden
units, the layers' partial outputs summed across the group.

What is split (dsa_backend/weights.py slices the checkpoint to match, `ModelConfig.sharded` gives
a rank's sizes): the attention's heads (q_b_proj and kv_b_proj by rows, o_proj by columns) and the
hidden units of every MLP, the routed experts' included (gate and up by rows, down by columns), so
each rank holds every expert at 1/size of its width. Each attention and each MLP output is then a
partial sum, reduced across the ranks (`all_reduce`). Everything else is replicated: the
embedding and the head, the norms, the latent projections and the whole MLA latent cache (one
latent a token serves every head), the router, and the indexer with its key cache (its top-k
must be the same on every rank, and its weights are small).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# Debugging aid for a machine of one GPU: every rank on that GPU, meeting over gloo through the
# host (NCCL refuses two ranks on one GPU). It checks a sharded model's numbers with the GPU's
# kernels; gloo cannot run inside a CUDA graph, so steps run eagerly.
SHARE_ONE_GPU = "DSA_TP_SHARE_ONE_GPU"


def shares_one_gpu() -> bool:
    return os.environ.get(SHARE_ONE_GPU) == "1"


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group: rank of size; group is None alone."""

    rank: int = 0
    size: int = 1
    group: object | None = None

    @property
    def captures_in_graphs(self) -> bool:
        """Whether its collectives can be captured in a CUDA graph (NCCL's can, gloo's cannot)."""
        return self.size == 1 or dist.get_backend(self.group) == "nccl"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks (in place; x itself alone)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's value, on every rank (e.g. the KV pages each one has room for)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def part(self, n: int) -> slice:
        """This rank's share of n rows or columns (n divisible by size)."""
        share = n // self.size
        return slice(self.rank * share, (self.rank + 1) * share)


def listen(size: int, timeout_s: float = 1800.0) -> dist.TCPStore:
    """Rank 0's rendezvous: a store listening on a free localhost port (its `port`) before any
    other rank starts. A port picked free now and listened on later can be taken meanwhile, even
    by the other ranks' own attempts to connect to it: on Linux a connection to a local port that
    nothing listens on can get that port as its own end and connect to itself, which left rank 0's
    listen failing with EADDRINUSE on a machine of two GPUs."""
    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join_group(rank: int, size: int, store: dist.TCPStore | int, device: torch.device,
               timeout_s: float = 1800.0) -> TensorParallel:
    """Join the group of `size` processes meeting at rank 0's store (given to rank 0, its port to
    the others): NCCL between GPUs, gloo on the CPU. timeout_s bounds a wait for the other ranks,
    long enough for one to load its weights later."""
    backend = "nccl" if device.type == "cuda" and not shares_one_gpu() else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if isinstance(store, int):
        store = dist.TCPStore("127.0.0.1", store, size, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s))
    # NCCL makes its communicator at the first collective, which must not be inside a graph capture
    dist.all_reduce(torch.zeros(1, device=device))
    return TensorParallel(rank, size, dist.group.WORLD)
