"""The served engine against the engine alone: the same requests through a real tritonserver (the
`dsa` ensemble over gRPC streams, as dsa_client.loadgen sends them) and through the Engine in this
process, at each concurrency, with the same engine settings.

    python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 1 8 32 [--waves 4] \
        --input-len 1024 --output-len 128 [--set KEY=VALUE ...] [--served-models dsa dsa_llm] [--json out.json]

Both sides keep `concurrency` requests in flight until all are done (a closed loop: a request starts
when one ends), with min_tokens = max_tokens so every request makes exactly --output-len tokens; a
level times `waves` x concurrency requests. The engine alone takes token ids (its prompts are
tokenized before the clock starts) and gives token ids; the served side pays everything a user's
request pays: gRPC, the tokenizer model, the ensemble, dsa_llm's response stream and the incremental
detokenizer (or, with --served-models dsa_llm, the same text requests sent to dsa_llm itself,
which tokenizes and detokenizes them; with both, each level runs on each in turn). Each side reports output tokens/s, TTFT (from a request's start to its first token) and
inter-token latency (dsa_client.stats), and the summary the served side's ratios to the engine's.
Every level first runs two untimed waves on each side (compiles, CUDA graph captures), then the
timed ones, each with prompts of its own (seeded), so that neither finds the other level's prompts in the prefix
cache. The engine runs first and is freed before the server starts on the same GPU. Prints one JSON
line; --json writes it to a file too.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import time
import urllib.request
from collections import deque
from dataclasses import asdict
from pathlib import Path

import torch

from dsa_backend.engine import Engine
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.serving.engine_config import engine_args
from dsa_backend.serving.fill_template import DEFAULTS, fill, parse_sets
from dsa_backend.serving.server import TritonServer
from dsa_backend.tokenizer import Tokenizer
from dsa_client.loadgen import sweep
from dsa_client.stats import percentiles
from dsa_client.workload import Request, make_requests
from report import emit

_IDS = itertools.count()


def engine_level(engine: Engine, prompts: list[list[int]], output_len: int, concurrency: int) -> dict:
    """Closed loop on the engine alone: the same summary fields as the served side's."""
    params = SamplingParams(max_tokens=output_len, min_tokens=output_len, temperature=0.0)
    waiting = deque(prompts)
    started, arrivals, made = {}, {}, 0  # arrivals: the times of a request's outputs that carried tokens

    def start_one(now: float) -> None:
        rid = f"bench-{next(_IDS)}"
        engine.add_request(rid, waiting.popleft(), params)
        started[rid], arrivals[rid] = now, []

    t0 = time.perf_counter()
    for _ in range(min(concurrency, len(waiting))):
        start_one(t0)
    in_flight = len(started)
    while in_flight:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.new_token_ids:
                arrivals[out.request_id].append(now)
                made += len(out.new_token_ids)
            if out.finished:
                in_flight -= 1
                if waiting:
                    start_one(now)
                    in_flight += 1
    wall = time.perf_counter() - t0
    return {"requests": len(prompts), "wall_s": wall, "output_tokens": made, "output_tokens_per_s": made / wall,
            "ttft_s": percentiles([times[0] - started[rid] for rid, times in arrivals.items() if times]),
            "itl_s": percentiles([b - a for times in arrivals.values() for a, b in zip(times, times[1:])])}


def workloads(args) -> dict[tuple[int, str], tuple[list[Request], list[Request]]]:
    """Per concurrency and served model: (untimed warm-up requests, timed requests), each with
    prompts of its own, so that no level finds another's in the prefix cache (the engine alone
    takes the first model's). Two warm-up waves: the second wave's prefills run beside the
    first's decodes, as in the timed ones (a shape one wave never makes compiled mid-level on the
    engine at concurrency 8)."""
    seeds = itertools.count(args.seed)
    return {(c, m): tuple(make_requests(n, args.input_len, args.output_len, seed=next(seeds))
                          for n in (2 * c, args.waves * c))
            for c in args.concurrency for m in args.served_models}


def model_stats(server: TritonServer) -> dict[str, dict]:
    """Triton's cumulative statistics a model: requests, executions, queue and compute ns."""
    url = f"http://127.0.0.1:{server.ports.http}/v2/models/stats"
    stats = json.load(urllib.request.urlopen(url, timeout=10))["model_stats"]
    keys = ("queue", "compute_input", "compute_infer", "compute_output")
    return {m["name"]: {"requests": m["inference_stats"]["success"]["count"], "executions": m["execution_count"],
                        **{f"{k}_ns": m["inference_stats"][k]["ns"] for k in keys}} for m in stats}


def per_request_us(before: dict, after: dict) -> dict[str, dict]:
    """What each model took a request over one level (the python models' requests are the
    ensemble's steps: postprocessing's are the streamed deltas)."""
    out = {}
    for name, a in after.items():
        b = before.get(name, dict.fromkeys(a, 0))
        n = a["requests"] - b["requests"]
        out[name] = {"requests": n, "executions": a["executions"] - b["executions"],
                     **{k.removesuffix("_ns") + "_us": round((a[k] - b[k]) / max(n, 1) / 1e3, 1)
                        for k in a if k.endswith("_ns")}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--waves", type=int, default=4, help="timed requests a level: waves x concurrency")
    parser.add_argument("--input-len", type=int, default=1024, help="prompt length in words (about tokens)")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--served-models", nargs="+", default=["dsa"], choices=["dsa", "dsa_llm"],
                        help="what the served side sends to, each level in turn: the dsa ensemble, dsa_llm "
                             "(text straight to it)")
    parser.add_argument("--all-outputs", action="store_true",
                        help="the served requests ask for every output, as perf_analyzer does (by default only "
                             "those the client reads)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="model repository parameter for both sides (max_running_requests defaults to the "
                             "largest concurrency; data_parallel_size to 1, and the engine alone is always one)")
    parser.add_argument("--repository", default="runs/bench_serving/model_repository")
    parser.add_argument("--timeout-s", type=float, default=600, help="per served request")
    parser.add_argument("--json", help="also write the JSON line here")
    args = parser.parse_args()

    sets = {"max_running_requests": str(max(args.concurrency)), "data_parallel_size": "1", **parse_sets(args.set)}
    settings = {**DEFAULTS, **sets, "model_dir": str(Path(args.model).resolve())}
    device = settings["device"] if settings["device"] != "auto" else ("cuda:0" if torch.cuda.is_available() else "cpu")
    load = workloads(args)

    engine = Engine(engine_args(settings, device))
    tokenizer = Tokenizer(args.model)
    alone = {}
    for c in args.concurrency:
        warm, timed = load[c, args.served_models[0]]
        engine_level(engine, [tokenizer.encode(r.prompt) for r in warm], args.output_len, c)
        alone[c] = engine_level(engine, [tokenizer.encode(r.prompt) for r in timed], args.output_len, c)
        print(f"engine alone, concurrency {c}: {alone[c]['output_tokens_per_s']:.1f} tok/s", flush=True)
    resolved = {k: str(v) for k, v in asdict(engine.args).items()}
    engine.close()     # its other tensor-parallel ranks would hold their GPUs through the served side
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    served = {}
    repository = fill(args.model, args.repository, sets)
    log_file = Path(args.repository).parent / "tritonserver.log"
    with TritonServer(repository, log_file=log_file, exit_timeout_s=10) as server:
        for (c, m), (warm, timed) in load.items():
            options = {"model": m, "all_outputs": args.all_outputs}
            sweep(server.grpc_url, warm, [c], timeout_s=args.timeout_s, show_progress=False, **options)
            before = model_stats(server)
            [served[c, m]] = sweep(server.grpc_url, timed, [c], timeout_s=args.timeout_s, show_progress=False,
                                   **options)
            served[c, m]["triton_models"] = per_request_us(before, model_stats(server))
            print(f"served by {m}, concurrency {c}: {served[c, m]['output_tokens_per_s'] or 0:.1f} tok/s, "
                  f"errors {served[c, m]['errors']}", flush=True)

    def ratio(a, b):
        return None if a is None or not b else round(a / b, 3)

    levels = [{"concurrency": c, "served_model": m, "engine": alone[c], "served": level,
               "served_over_engine_tokens_per_s": ratio(level["output_tokens_per_s"], alone[c]["output_tokens_per_s"]),
               "served_over_engine_itl_p50": ratio(level["itl_s"]["p50"], alone[c]["itl_s"]["p50"]),
               "served_over_engine_ttft_p50": ratio(level["ttft_s"]["p50"], alone[c]["ttft_s"]["p50"])}
              for (c, m), level in served.items()]
    emit({"bench": "serving", "date": datetime.date.today().isoformat(),
          "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
          "model": args.model, "settings": sets, "engine_args": resolved, "input_len": args.input_len,
          "output_len": args.output_len, "waves": args.waves, "all_outputs": args.all_outputs, "levels": levels},
         args.json)


if __name__ == "__main__":
    main()
