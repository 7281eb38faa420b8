"""The start-up warm-up's compiles, spread over worker processes.

A cold warm-up is mostly Triton compiling, one kernel config after another on one CPU core (the
one-launch top-k's variants take 1-2 s each). Here worker processes share the warm-up's calls
(dsa_backend.warmup.warmup_calls) and run them against pools of their own (one layer, one longest
request's pages, on the engine's GPU): every config they meet is compiled into Triton's cache on
disk, and each worker reports the calls that made it load a kernel. The engine then runs only
those calls itself. Each loads its configs from that cache, so after them no step shape compiles
or loads anything, and the other calls would add nothing.

The calls are grouped by the top-k launch they compile (the warm-up's slowest compiles), cut into
contiguous blocks, and a worker claims a block (a file made exclusively) before it runs it. Each
worker starts at its own part of the list, so that a config is mostly compiled by one worker, not
several; one that is done takes the blocks nobody has claimed yet.

The workers run before the engine allocates its pools: their GPU memory (a context and a few
hundred MiB each) is given back by then. A worker that fails or times out costs nothing but time:
the engine then runs every call, as without workers.

    python3 -m dsa_backend.warmup_workers JOB.json WORKER WORKERS RESULT.json   (what a worker runs)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

from dsa_backend.batch import ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.config import ModelConfig
from dsa_backend.warmup import Call, WarmupShapes, warm_up, warmup_calls
from dsa_kernels.device import num_sms
from dsa_kernels.topk import launch_choice

logger = logging.getLogger(__name__)

_BLOCKS_PER_WORKER = 16


def default_workers() -> int:
    """Half the CPU cores this process may use, at most 8: a compile takes one core, and the
    workers share the GPU (and the host with whatever else the server runs)."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


def compile_order(calls: list[Call], topk: int, sms: int) -> list[Call]:
    """The calls grouped by the top-k launch they compile (kernels/topk.launch_choice; the logits'
    widths to a multiple of 16, a prefill piece's over all its requests' keys), each group in the
    listed order. As listed, each part of the prefill ladder meets the same top-k variants: at 8
    requests, 256 tokens and 16K contexts on 132 SMs, eight workers taking an eighth of the list
    each would compile 124 top-k variants, of 39 distinct ones; grouped, 45."""
    def group(call: Call) -> str:
        if call[0] == "mla":
            return "mla"
        _, requests, tokens, context, mode = call
        keys = requests * context if mode == ForwardMode.EXTEND.name else context
        return repr(launch_choice(requests * tokens, -(-keys // 16) * 16, topk, sms))

    return sorted(calls, key=group)


def blocks(num_calls: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) blocks covering every call once."""
    n = max(1, min(num_calls, workers * _BLOCKS_PER_WORKER))
    return [(num_calls * i // n, num_calls * (i + 1) // n) for i in range(n)]


def claim_order(num_blocks: int, worker: int, workers: int) -> list[int]:
    """The blocks in the order a worker tries to claim them: from its own part of the list on,
    then around."""
    first = num_blocks * worker // workers
    return [(first + i) % num_blocks for i in range(num_blocks)]


@dataclasses.dataclass(frozen=True)
class WorkerCache:
    """What a worker needs to build pools like the engine's."""

    model: str
    page_size: int
    dtype: str               # torch dtype name, e.g. "bfloat16"
    kv_cache_dtype: str
    device: str


def compile_in_workers(cache: WorkerCache, shapes: WarmupShapes, workers: int, topk: int,
                       timeout_s: float = 3600.0) -> list[Call] | None:
    """Run the warm-up's calls for `shapes` (max_context_len already clamped to the engine's
    pools; `topk` the model's index_topk) in `workers` processes; the calls that loaded a kernel,
    in the warm-up's order, or None where a worker failed."""
    listed = [call for phase in warmup_calls(shapes, shapes.max_context_len, cache.page_size).values()
              for call in phase]
    calls = compile_order(listed, topk, num_sms(torch.device(cache.device)))
    workers = max(1, min(workers, len(calls)))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dsa-warmup-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"cache": dataclasses.asdict(cache), "shapes": dataclasses.asdict(shapes),
                                   "calls": calls, "blocks": blocks(len(calls), workers), "claims": tmp,
                                   "parent": os.getpid()}))
        procs = []
        loaded, failed, seconds = set(), 0, []
        try:
            for worker in range(workers):
                result = Path(tmp) / f"result{worker}.json"
                procs.append((subprocess.Popen([_python(), "-m", __name__, str(job), str(worker), str(workers),
                                                str(result)]), result))
            for proc, result in procs:
                try:
                    code = proc.wait(timeout=max(timeout_s - (time.perf_counter() - start), 0))
                except subprocess.TimeoutExpired:
                    code = "timed out"
                if code == 0 and result.exists():
                    report = json.loads(result.read_text())
                    loaded.update(tuple(call) for call in report["loaded"])
                    seconds.append(report["seconds"])
                else:
                    failed += 1
                    logger.warning("DSA kernel warm-up: a worker failed (%s); the engine runs every call itself",
                                   code)
        finally:  # none outlives the wait (a timeout, or the model unloaded meanwhile)
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    if failed:
        return None
    logger.info("DSA kernel warm-up: %d workers ran %d calls in %.1f s (%.1f-%.1f s a worker); %d of them loaded "
                "kernels", workers, len(calls), time.perf_counter() - start, min(seconds), max(seconds), len(loaded))
    return [call for call in listed if call in loaded]


def _python() -> str:
    """This interpreter, or inside Triton's python backend stub (whose executable is no Python)
    the first python3 on PATH, whose environment the stub takes its packages from."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    return shutil.which("python3") or sys.executable


def _run_worker(job: dict, worker: int, workers: int) -> dict:
    """The calls of the job that loaded a kernel, and the seconds the worker took."""
    start = time.perf_counter()
    spec, shapes = WorkerCache(**job["cache"]), WarmupShapes(**job["shapes"])
    full = ModelConfig.from_pretrained(spec.model)
    # the warm-up reads the first layer's pools only
    config = dataclasses.replace(full, num_hidden_layers=1, num_nextn_predict_layers=0,
                                 indexer_plan=full.indexer_plan[:1])
    pool = KVCache(config, pages_needed(shapes.max_context_len, spec.page_size), spec.page_size,
                   dtype=getattr(torch, spec.dtype), kv_cache_dtype=spec.kv_cache_dtype, device=spec.device)
    seen, loaded = [], []

    def on_kernel_load(**kw) -> bool:
        seen.append(kw["fn"].name)
        return False  # go on and compile (or load) it

    triton.knobs.runtime.jit_cache_hook = on_kernel_load

    def on_call(call: Call) -> None:
        if seen:
            loaded.append(call)
            seen.clear()

    warm_up(pool, config, shapes, calls=_claimed_calls(job, worker, workers), on_call=on_call)
    return {"loaded": loaded, "seconds": round(time.perf_counter() - start, 2)}


def _claimed_calls(job: dict, worker: int, workers: int):
    """The calls of every block this worker claims, claimed one block at a time as it gets there;
    none once the engine's process is gone (the worker was handed to another parent)."""
    spans = job["blocks"]
    for i in claim_order(len(spans), worker, workers):
        if os.getppid() != job["parent"]:
            return
        try:
            os.close(os.open(Path(job["claims"]) / f"block{i}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        for call in job["calls"][spans[i][0]:spans[i][1]]:
            yield tuple(call)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    job_file, worker, workers, result_file = sys.argv[1:5]
    report = _run_worker(json.loads(Path(job_file).read_text()), int(worker), int(workers))
    Path(result_file).write_text(json.dumps(report))
