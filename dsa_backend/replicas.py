"""Replicas: data parallelism, several engines (each an EngineProcess on GPUs of its own) serving
one dsa_llm instance.

Triton's KIND_GPU puts a model instance on every GPU, but a request's later calls reach whichever
instance Triton picks: postprocessing's abort of a cancelled stream (a BLS call) and the drain at
shutdown would miss the instance holding the request, and every instance would set the same
gauges. So one instance holds all replicas. A request goes to the replica with the fewest samples
in flight, all its samples together (they share the prompt's pages: the prefix cache is a
replica's own), and its aborts go to that replica. Replica r runs on the tensor_parallel_size GPUs
from device + r * tensor_parallel_size.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor

import torch

from dsa_backend.engine import EngineArgs
from dsa_backend.engine_process import EngineProcess

logger = logging.getLogger(__name__)


def replica_args(args: EngineArgs, replica: int) -> EngineArgs:
    """Replica `replica`'s engine settings: args on the GPUs after the previous replicas'."""
    device = args.resolved_device()
    if device.type != "cuda" or replica == 0:
        return args
    first = (device.index or 0) + replica * args.tensor_parallel_size
    return dataclasses.replace(args, device=f"cuda:{first}")


class Replicas:
    """`size` engines in processes of their own, each started as EngineProcess starts one."""

    def __init__(self, args: EngineArgs, size: int):
        if size < 1:
            raise ValueError(f"data_parallel_size must be positive, got {size}")
        device = args.resolved_device()
        gpus = size * args.tensor_parallel_size
        if device.type == "cuda" and (device.index or 0) + gpus > torch.cuda.device_count():
            raise ValueError(f"data_parallel_size={size} x tensor_parallel_size={args.tensor_parallel_size} "
                             f"needs {gpus} GPUs from {device}; this machine has {torch.cuda.device_count()}")
        # The first replica alone: its warm-up fills Triton's kernel cache on disk, where the
        # others, started together after it, find every kernel compiled.
        self.engines = [EngineProcess(replica_args(args, 0))]
        if size > 1:
            with ThreadPoolExecutor(size - 1, thread_name_prefix="dsa-replica-start") as pool:
                starts = [pool.submit(EngineProcess, replica_args(args, r)) for r in range(1, size)]
            self.engines += [s.result() for s in starts if s.exception() is None]
            failed = [s.exception() for s in starts if s.exception() is not None]
            if failed:
                self.shutdown(5.0)
                raise failed[0]

    def choose(self) -> EngineProcess:
        """The replica a new request goes to: the one with the fewest samples in flight, among
        those taking requests (a replica restarting its engine refuses them) if any are."""
        taking = [e for e in self.engines if e.refusal is None] or self.engines
        return min(taking, key=lambda e: e.num_in_flight)

    def stats(self) -> list[dict[str, float]]:
        """Each replica's engine stats (a restarted engine's totals count from 0 again)."""
        return [engine.stats() for engine in self.engines]

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Shut every replica down at once (each ends its requests in flight with an "abort")."""
        with ThreadPoolExecutor(len(self.engines), thread_name_prefix="dsa-replica-stop") as pool:
            list(pool.map(lambda engine: engine.shutdown(timeout_s), self.engines))
