"""Replicas: data parallelism, several engines (each an EngineProcess on GPUs of its own) serving
one dsa_llm instance.

Triton's KIND_GPU puts a model instance on every GPU, but a request's later calls reach whichever
instance Triton picks: postprocessing's abort of a cancelled stream (a BLS call) and the drain at
shutdown would miss the instance holding the request, and every instance would set the same
gauges. So one instance holds all replicas. A request goes to one replica, all its samples
together (they share the prompt's pages), and its aborts go there. Replica r runs on the
tensor_parallel_size GPUs from device + r * tensor_parallel_size.

Each replica has a prefix cache of its own, so where a request goes decides what it finds cached:
a conversation's next turn sent to another replica than its earlier turns computes them all
again. PrefixRouter sends a prompt to the replica that was sent the longest run of its first
pages, unless that one is busier than the least busy by more than a margin (SGLang's router
balances its cache-aware choice the same way); otherwise, and for prompts nobody was sent, to the
one with the fewest requests in flight. LeastBusyRouter (replica_routing=least_busy) only
balances.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch

from dsa_backend.cache.prefix_cache import page_keys
from dsa_backend.engine import EngineArgs
from dsa_backend.engine_process import EngineProcess


def replica_args(args: EngineArgs, replica: int) -> EngineArgs:
    """Replica `replica`'s engine settings: args on the GPUs after the previous replicas'."""
    device = args.resolved_device()
    if device.type != "cuda" or replica == 0:
        return args
    first = (device.index or 0) + replica * args.tensor_parallel_size
    return dataclasses.replace(args, device=f"cuda:{first}")


# A replica busier than the least busy by more than max(this, a quarter of the least's load)
# takes no request for its cached prefix: the prefix is computed again elsewhere instead.
_BALANCE_SLACK = 4


class PrefixRouter:
    """Which replica a prompt goes to. Each replica's index holds the prefix cache's keys
    (`page_keys`: a page's key covers every token before it) of the whole pages of the prompts
    sent to it, at most as many as its pool has pages, the least recently sent evicted first: an
    estimate of what its prefix cache holds, kept without asking the engines."""

    def __init__(self, page_size: int, capacities: list[int]):
        self.page_size = page_size
        self._capacities = capacities
        self._indexes: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in capacities]

    def choose(self, prompt: list[int], loads: list[int], eligible: list[int]) -> int:
        """The replica among `eligible` for `prompt`, given each replica's requests in flight."""
        chain = page_keys(prompt, self.page_size)
        least = min(eligible, key=lambda r: loads[r])
        best, best_pages = least, 0
        for r in eligible:
            pages = self._cached_pages(r, chain)
            if pages > best_pages or (pages == best_pages and loads[r] < loads[best]):
                best, best_pages = r, pages
        if loads[best] - loads[least] > max(_BALANCE_SLACK, loads[least] // 4):
            best = least
        self._remember(best, chain)
        return best

    def _cached_pages(self, replica: int, chain: list[bytes]) -> int:
        index = self._indexes[replica]
        pages = 0
        while pages < len(chain) and chain[pages] in index:
            pages += 1
        return pages

    def _remember(self, replica: int, chain: list[bytes]) -> None:
        index = self._indexes[replica]
        for h in chain:
            index[h] = None
            index.move_to_end(h)
        while len(index) > self._capacities[replica]:
            index.popitem(last=False)


class LeastBusyRouter:
    """Every prompt to the replica with the fewest requests in flight, the first on ties."""

    def choose(self, prompt: list[int], loads: list[int], eligible: list[int]) -> int:
        return min(eligible, key=lambda r: loads[r])


ROUTINGS = ("prefix", "least_busy")


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise ValueError(f"replica_routing must be one of {', '.join(ROUTINGS)}; got {routing!r}")
    return routing


def make_router(routing: str, prefix_caching: bool, page_size: int,
                capacities: list[int]) -> PrefixRouter | LeastBusyRouter:
    """replica_routing's router: for a cached prefix (PrefixRouter; without prefix caching there
    is none to find) or for load alone."""
    if check_routing(routing) == "prefix" and prefix_caching:
        return PrefixRouter(page_size, capacities)
    return LeastBusyRouter()


class Replicas:
    """`size` engines in processes of their own, each started as EngineProcess starts one."""

    def __init__(self, args: EngineArgs, size: int, routing: str = "prefix"):
        if size < 1:
            raise ValueError(f"data_parallel_size must be positive, got {size}")
        check_routing(routing)                # refused before any engine starts
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
        self._router = make_router(routing, args.enable_prefix_caching, self.engines[0].limits.page_size,
                                   [e.limits.num_kv_pages for e in self.engines])

    def choose(self, prompt: list[int]) -> EngineProcess:
        """The replica a new request goes to, by the router, among those taking requests (a
        replica restarting its engine refuses them) if any are."""
        if len(self.engines) == 1:
            return self.engines[0]
        eligible = [r for r, e in enumerate(self.engines) if e.refusal is None] or list(range(len(self.engines)))
        loads = [e.num_in_flight for e in self.engines]
        return self.engines[self._router.choose(prompt, loads, eligible)]

    def stats(self) -> list[dict[str, float]]:
        """Each replica's engine stats (a restarted engine's totals count from 0 again)."""
        return [engine.stats() for engine in self.engines]

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Shut every replica down at once (each ends its requests in flight with an "abort")."""
        with ThreadPoolExecutor(len(self.engines), thread_name_prefix="dsa-replica-stop") as pool:
            list(pool.map(lambda engine: engine.shutdown(timeout_s), self.engines))
