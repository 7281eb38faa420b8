"""Load generator for the `dsa` ensemble: concurrency or request-rate sweeps over gRPC streams.

    python -m dsa_client.loadgen --url 127.0.0.1:8001 --concurrency 1 4 16 --num-requests 64 \
        --input-len 128 --output-len 64 --out runs/load

writes runs/load/results.json (TTFT, inter-token and end-to-end latency p50/p90/p99, output
tokens/s, requests/s and the prefix cache's share of prompt tokens per level), runs/load/results.png,
and runs/load/perf_analyzer_inputs.json. --turns T sends conversations of T turns, each resending
its history.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dsa_client.grpc_stream import MODEL, Completion, generate
from dsa_client.perf_inputs import write_perf_analyzer_data
from dsa_client.stats import summarize
from dsa_client.workload import Request, make_requests

logger = logging.getLogger(__name__)


def _send(url: str, prompt: str, max_tokens: int, timeout_s: float, **options: Any) -> Completion:
    """options: generate's model and all_outputs."""
    try:
        # min_tokens == max_tokens fixes the output length whatever the model samples.
        return generate(url, prompt, max_tokens, min_tokens=max_tokens, temperature=0.0,
                        exclude_input_in_output=True, timeout_s=timeout_s, **options)
    except Exception as e:     # a failed request is counted, not fatal to the sweep
        return Completion(error=f"{type(e).__name__}: {e}", final=True)


def converse(url: str, request: Request, timeout_s: float, **options: Any) -> list[Completion]:
    """A request and then its follow-up turns, one after another, each turn's prompt the one
    before it, its reply and the turn's text; a turn that fails ends the conversation."""
    completions = [_send(url, request.prompt, request.max_tokens, timeout_s, **options)]
    prompt = request.prompt
    for follow_up in request.follow_ups:
        if completions[-1].error:
            break
        prompt = f"{prompt}{completions[-1].text} {follow_up}"
        completions.append(_send(url, prompt, request.max_tokens, timeout_s, **options))
    return completions


def run_concurrency(url: str, requests: list[Request], concurrency: int, timeout_s: float,
                    progress: tqdm | None = None, **options: Any) -> tuple[list[Completion], float]:
    """Keep `concurrency` requests (conversations) in flight until all are done; returns every
    turn's completion and the wall time."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(converse, url, r, timeout_s, **options) for r in requests]
        for f in futures:
            f.add_done_callback(lambda _: progress and progress.update(1))
        completions = [c for f in futures for c in f.result()]
    return completions, time.perf_counter() - start


def run_rate(url: str, requests: list[Request], rate: float, timeout_s: float, seed: int = 0,
             progress: tqdm | None = None, **options: Any) -> tuple[list[Completion], float]:
    """Start requests (conversations) as a Poisson process of `rate` a second; returns every turn's
    completion and the wall time."""
    rng = random.Random(seed)
    results: list[list[Completion] | None] = [None] * len(requests)
    threads = []
    start = time.perf_counter()
    next_at = start
    for i, r in enumerate(requests):
        time.sleep(max(0.0, next_at - time.perf_counter()))

        def work(i=i, r=r):
            results[i] = converse(url, r, timeout_s, **options)
            if progress:
                progress.update(1)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        threads.append(thread)
        next_at += rng.expovariate(rate)
    for thread in threads:
        thread.join(timeout_s)
    missing = [Completion(error="no result within the timeout", final=True)]
    done = [c for turns in results for c in (turns or missing)]
    return done, time.perf_counter() - start


def sweep(url: str, requests: list[Request], concurrency: list[int] | None = None, rates: list[float] | None = None,
          timeout_s: float = 600, show_progress: bool = True, **options: Any) -> list[dict]:
    """Run every load level in turn; one summary per level. options: generate's `model` (the
    `dsa` ensemble, or dsa_llm, which takes the same text requests itself: docs/SERVING.md, "Text
    straight to dsa_llm") and `all_outputs` (ask for every output, as perf_analyzer does)."""
    levels = [("concurrency", c) for c in concurrency or []] + [("request_rate", r) for r in rates or []]
    summaries = []
    for kind, value in levels:
        with tqdm(total=len(requests), desc=f"{kind}={value}", disable=not show_progress) as bar:
            if kind == "concurrency":
                completions, wall = run_concurrency(url, requests, int(value), timeout_s, bar, **options)
            else:
                completions, wall = run_rate(url, requests, float(value), timeout_s, progress=bar, **options)
        summary = {kind: value, **summarize(completions, wall)}
        errors = sorted({c.error for c in completions if c.error})
        if errors:
            summary["error_samples"] = errors[:5]
        summaries.append(summary)
    return summaries


def plot(summaries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for kind in ("concurrency", "request_rate"):
        rows = [s for s in summaries if kind in s]
        if not rows:
            continue
        x = [s[kind] for s in rows]
        axes[0].plot(x, [s["output_tokens_per_s"] for s in rows], "o-", label=kind)
        for p, style in (("p50", "o-"), ("p99", "s--")):
            axes[1].plot(x, [s["ttft_s"][p] for s in rows], style, label=f"{kind} {p}")
            axes[2].plot(x, [1e3 * (s["itl_s"][p] or 0) for s in rows], style, label=f"{kind} {p}")
    for ax, title in zip(axes, ("output tokens/s", "time to first token (s)", "inter-token latency (ms)")):
        ax.set_title(title)
        ax.set_xlabel("concurrency or request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument("--model", default=MODEL,
                        help="the Triton model to send to: the dsa ensemble, or dsa_llm (text straight to it)")
    parser.add_argument("--all-outputs", action="store_true",
                        help="ask for every output, as perf_analyzer does (by default only those it reads)")
    parser.add_argument("--concurrency", type=int, nargs="*", help="concurrency levels to sweep")
    parser.add_argument("--request-rate", type=float, nargs="*", help="request rates (req/s) to sweep")
    parser.add_argument("--num-requests", type=int, default=32, help="requests per level")
    parser.add_argument("--input-len", type=int, default=128, help="prompt length in tokens (mean)")
    parser.add_argument("--input-len-std", type=float, default=0, help="0: fixed prompt length")
    parser.add_argument("--shared-prefix-len", type=int, default=0,
                        help="tokens every prompt starts with (a system prompt), before its own --input-len")
    parser.add_argument("--turns", type=int, default=1,
                        help="turns a conversation: each later turn resends the history (prompts and replies) "
                             "and --input-len tokens more; a level's requests are conversations")
    parser.add_argument("--output-len", type=int, default=64, help="generated tokens (mean)")
    parser.add_argument("--output-len-std", type=float, default=0, help="0: fixed output length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600, help="per request")
    parser.add_argument("--out", default="runs/load", help="directory for results.json/.png and inputs")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if not args.concurrency and not args.request_rate:
        parser.error("give --concurrency and/or --request-rate levels")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    requests = make_requests(args.num_requests, args.input_len, args.output_len, args.input_len_std,
                             args.output_len_std, args.seed, args.shared_prefix_len, args.turns)
    write_perf_analyzer_data(out / "perf_analyzer_inputs.json", requests)
    summaries = sweep(args.url, requests, args.concurrency, args.request_rate, args.timeout_s,
                      show_progress=not args.no_progress, model=args.model, all_outputs=args.all_outputs)
    config = {k: v for k, v in vars(args).items() if k not in ("no_progress",)}
    (out / "results.json").write_text(json.dumps({"config": config, "levels": summaries}, indent=2))
    plot(summaries, out / "results.png")
    for s in summaries:
        level = f"concurrency={s['concurrency']}" if "concurrency" in s else f"rate={s['request_rate']}/s"
        logger.info("%s: %.1f output tok/s, %.2f req/s, TTFT p50 %s s, ITL p50 %s s, prefix cache hits %s, "
                    "draft acceptance %s, errors %d", level, s["output_tokens_per_s"] or 0, s["requests_per_s"] or 0,
                    _fmt(s["ttft_s"]["p50"]), _fmt(s["itl_s"]["p50"]), _fmt(s["prefix_cache_hit_rate"]),
                    _fmt(s["acceptance_rate"]), s["errors"])
    logger.info("wrote %s, %s and %s", out / "results.json", out / "results.png", out / "perf_analyzer_inputs.json")
    return 0 if all(s["errors"] == 0 for s in summaries) else 1


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    raise SystemExit(main())
