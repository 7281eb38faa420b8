"""Engine decode throughput: the kernel backend replaying CUDA graphs (graph; graph-sync with
overlap scheduling off), the kernel backend eagerly (kernel), the reference (torch) DSA backend,
and the engine as built (engine: its own backend, its graphs if any, its overlap setting).

    python3 benchmarks/bench_engine.py --model /tmp/v32 [--batch 32] [--prompt-len 2304] [--steps 32] [--rounds 3]
        [--backends graph,graph-sync,kernel,torch,engine] [--speculative-num-steps 2] [--fp8-weights keep,dequantize]
        [--tensor-parallel-size 8 --backends engine] [--backends engine,guided [--guide JSON]]

With --tensor-parallel-size > 1 only `engine` runs: the other ranks keep the engine as it was built.

All serve the same requests on one Engine (loaded once); only decode steps (every
request past its prefill) are timed, each on its own too (steps_ms, median_step_ms: a compile or a
slow host shows as one step). The step is host-bound and moved by up to 1.5x between processes on
one machine, so --rounds alternates the backends in this one process, and the summary takes each
backend's median over its rounds, and the ratio of each backend's tokens/s to the next one's in
the list (graph_over_kernel, kernel_over_torch). `guided` is `engine` with every request guided by
--guide (structured output, dsa_backend/guided.py): its grammar masks each step's logits. --fp8-weights with several settings loads one
engine a setting (an FP8 checkpoint's weights kept in e4m3, or dequantized) and runs each backend
on each, tagged `<backend>-<setting>` (graph-keep_over_graph-dequantize). A graph run captures its buckets during its
prefill and warm-up steps, which are not timed. Prints one JSON line; --json writes it to a file too.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import time

import torch

import dsa_kernels
from dsa_backend.attention import KernelDsaBackend, TorchDsaBackend
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams
from report import emit


_MAX_TOKENS = 512
_RUNS = itertools.count()  # request ids and prompts: new for every run
# A guide no request can finish within the timed steps: JSON records, at least 200 of them
_GUIDE = {"json": {"type": "array", "minItems": 200, "items": {
    "type": "object", "required": ["name", "age", "tags"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}}}}, "disable_any_whitespace": True}


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def decode_throughput(engine: Engine, backend, graphs, overlap: bool, guide: dict | None, batch: int, prompt_len: int,
                      steps: int, warmup: int, tag: str, repetition_penalty: float = 1.0, temperature: float = 0.0) -> dict:
    engine.model.backend = backend
    engine.graphs = graphs  # None: eager decode steps
    engine.overlap = overlap and engine.spec is None  # speculative steps read back at once
    run = next(_RUNS)
    # New prompts every run: the same ones would find the last run's pages in the prefix cache
    gen = torch.Generator().manual_seed(run)
    # Requests prefilled first decode while later ones prefill, so no request may run out of
    # max_tokens inside the timed window: time a fixed number of steps, then abort what is left.
    # sampled requests carry a seed each, as a client that wants reproducible samples sends
    # (a guide's end admits EOS, so a guided request cannot ignore it)
    params = [SamplingParams(max_tokens=_MAX_TOKENS, temperature=temperature, ignore_eos=guide is None,
                             repetition_penalty=repetition_penalty, seed=i if temperature > 0 else None,
                             guided_decoding=guide)
              for i in range(batch)]
    ids = [f"{tag}-{run}-{i}" for i in range(batch)]
    for rid, request_params in zip(ids, params):
        engine.add_request(rid, torch.randint(2, 128000, (prompt_len,), generator=gen).tolist(), request_params)
    produced = dict.fromkeys(ids, 0)
    t_prefill = time.perf_counter()
    while min(produced.values()) < 1 + warmup:  # prefill, then warm-up decode steps
        for out in engine.step():
            produced[out.request_id] += len(out.new_token_ids)
    _sync(engine)
    t0 = time.perf_counter()
    tokens = 0
    # Each step on its own, so that a stall (a compile, a slow host) shows as one. No sync between
    # steps: with overlap scheduling a step returns while its forward runs, and the next one's
    # read back waits for it, so a step's host time is the pipeline's period.
    step_ms = []
    for _ in range(steps):
        t = time.perf_counter()
        tokens += sum(len(o.new_token_ids) for o in engine.step())
        step_ms.append(round(1000 * (time.perf_counter() - t), 2))
    _sync(engine)
    elapsed = time.perf_counter() - t0
    n_steps = steps
    print(f"{tag}: {n_steps} decode steps, {tokens / elapsed:.1f} tokens/s, median step {statistics.median(step_ms):.2f} ms "
          f"(prefill + warm-up {t0 - t_prefill:.1f} s)", flush=True)
    for rid in produced:
        engine.abort(rid)
    while engine.step():  # let the aborts free their pages
        pass
    return dict(backend=tag, decode_steps=n_steps, tokens=tokens, seconds=round(elapsed, 4),
                tokens_per_s=round(tokens / elapsed, 1), step_ms=round(1000 * elapsed / n_steps, 2),
                median_step_ms=round(statistics.median(step_ms), 2), steps_ms=step_ms, prefill_and_warmup_s=round(t0 - t_prefill, 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=2304)  # past index_topk (2048): real sparse top-k
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--kv-cache-dtype", default="fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backends", default="graph,kernel,torch",
                    help="comma list of graph, graph-sync, kernel, torch, engine, guided")
    ap.add_argument("--guide", default=json.dumps(_GUIDE), help="backend guided: vLLM's guided_decoding object")
    ap.add_argument("--batch-invariant", action="store_true", help="EngineArgs.batch_invariant (patches this process)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the backends this many times in this process")
    ap.add_argument("--speculative-num-steps", type=int, default=0,
                    help="> 0: MTP chain drafting, this many drafts a step (graphs then serve the verify steps)")
    ap.add_argument("--fp8-weights", default="auto", help="comma list of EngineArgs.fp8_weights: an engine each")
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="on every request (the sampler then reads each request's output)")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled requests, seeded")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs sharing each layer (backends: engine)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.tensor_parallel_size > 1 and a.backends != "engine":
        ap.error("--tensor-parallel-size > 1 runs --backends engine alone: the other ranks keep the engine as built")
    pages = a.batch * (-(-(a.prompt_len + _MAX_TOKENS + a.speculative_num_steps + 1) // 64)) + 8
    settings = a.fp8_weights.split(",")
    engines = {}
    for setting in settings:
        t = time.perf_counter()
        engines[setting] = Engine(EngineArgs(
            model=a.model, device=a.device, kv_cache_dtype=a.kv_cache_dtype, num_kv_pages=pages,
            max_running_requests=a.batch, max_num_batched_tokens=8192, batch_invariant=a.batch_invariant,
            fp8_weights=setting, tensor_parallel_size=a.tensor_parallel_size, **(dict(speculative_algorithm="mtp", speculative_num_steps=a.speculative_num_steps)
                                    if a.speculative_num_steps else {})))
        print(f"engine (fp8_weights={setting}) loaded in {time.perf_counter() - t:.1f} s", flush=True)
    backend_tags = a.backends.split(",")
    if {"graph", "graph-sync"} & set(backend_tags) and any(e.graphs is None for e in engines.values()):
        ap.error("--backends graph needs CUDA graphs, which are off on the CPU and with --batch-invariant")
    runners = {}  # tag -> (engine, DSA backend, graphs)
    for setting, engine in engines.items():
        # graph: the model's own backend (None: the kernel backend on CUDA), the one its graphs captured
        # graph-sync: graph with overlap scheduling off (each step reads its tokens back before the next)
        backends = {"graph": (None, engine.graphs, True, None), "graph-sync": (None, engine.graphs, False, None),
                    "kernel": (KernelDsaBackend(), None, True, None), "torch": (TorchDsaBackend(), None, True, None),
                    "engine": (None, engine.graphs, engine.overlap, None),
                    "guided": (None, engine.graphs, engine.overlap, json.loads(a.guide))}
        for tag in backend_tags:
            runners[tag if len(settings) == 1 else f"{tag}-{setting}"] = (engine, *backends[tag])
    tags = list(runners)
    runs = [dict(decode_throughput(*runners[tag], a.batch, a.prompt_len, a.steps, a.warmup, tag, a.repetition_penalty,
                                  a.temperature),
                 round=r)
            for r in range(a.rounds) for tag in tags]
    for engine in engines.values():
        engine.close()
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                  tensor_parallel_size=a.tensor_parallel_size,
                  libraries=dsa_kernels.available_backends(a.device), model=a.model, batch=a.batch, prompt_len=a.prompt_len, kv_cache_dtype=a.kv_cache_dtype,
                  batch_invariant=a.batch_invariant, speculative_num_steps=a.speculative_num_steps,
                  repetition_penalty=a.repetition_penalty, temperature=a.temperature,
                  fp8_weights=settings, runs=runs)
    by = {tag: {key: statistics.median(r[key] for r in runs if r["backend"] == tag)
                for key in ("tokens_per_s", "median_step_ms")} for tag in tags}
    result["median_over_rounds"] = by
    for faster, slower in zip(tags, tags[1:]):
        result[f"{faster}_over_{slower}"] = round(by[faster]["tokens_per_s"] / by[slower]["tokens_per_s"], 2)
        result[f"{faster}_over_{slower}_median_step"] = round(
            by[slower]["median_step_ms"] / by[faster]["median_step_ms"], 2)
    emit(result, a.json)


if __name__ == "__main__":
    main()
