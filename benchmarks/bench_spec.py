"""Speculative decoding with a distilled MTP layer: plain vs chain vs tree drafting, one run.

    python3 benchmarks/bench_spec.py --out DIR [--device cuda|cpu] [--train-steps 300] [--batches 1,8,32]

Builds the tiny DeepSeek-V3.2 checkpoint with `--branch-scale 0.1` (a random target whose
continuations have structure, see make_checkpoint), distils its MTP layer with train_mtp, then
decodes the same random prompts plainly, with chain drafting (MTP, 2 steps) and with tree drafting
(EAGLE, 3 steps, top-2), each on a fresh engine with the same settings. Per batch size it reports
output tokens/s, the draft acceptance rate, the mean tokens a request gains per verify step, and
how many requests produced exactly the plain tokens. Times cover decoding only after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

MODES = {
    "plain": {},
    "chain": dict(speculative_algorithm="mtp", speculative_num_steps=2),
    "tree": dict(speculative_algorithm="eagle", speculative_num_steps=3, speculative_eagle_topk=2),
}


def decode(model: str, prompts: list[list[int]], device: str, dtype: str, max_tokens: int, spec: dict) -> dict:
    engine = Engine(EngineArgs(model=model, device=device, dtype=dtype, num_kv_pages=1024, **spec))
    for i, p in enumerate(prompts[:2]):  # warm-up
        engine.add_request(f"w{i}", p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    while engine.has_work():
        engine.step()
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    verifies, drafted, accepted = 0, 0, 0
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_work():
        for out in engine.step():
            verifies += bool(tokens[out.request_id]) and bool(out.new_token_ids)  # the first token is prefill's
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                drafted += out.num_draft_tokens
                accepted += out.num_accepted_draft_tokens
    elapsed = time.perf_counter() - start
    generated = sum(map(len, tokens.values()))
    return {"tokens": tokens, "tokens_per_s": generated / elapsed,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": (generated - len(prompts)) / verifies}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    base, distilled = "/tmp/spec-tiny", "/tmp/spec-tiny-mtp"
    py = sys.executable
    subprocess.run([py, "-m", "dsa_backend.tools.make_checkpoint", "--arch", "deepseek_v32", "--preset", "tiny",
                    "--branch-scale", "0.1", "--out", base], check=True)
    t0 = time.perf_counter()
    train = subprocess.run([py, "-m", "dsa_backend.tools.train_mtp", "--model", base, "--out", distilled,
                            "--steps", str(args.train_steps), "--sequences", "256", "--batch", "8",
                            "--lr", "1e-3", "--device", args.device], capture_output=True, text=True)
    if train.returncode:
        sys.exit(f"train_mtp failed:\n{train.stderr[-3000:]}")
    print(train.stderr[-1200:], train.stdout, f"training took {time.perf_counter() - t0:.0f} s", flush=True)
    gen = torch.Generator().manual_seed(5)
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "dtype": args.dtype,
               "train": json.loads(train.stdout.strip().splitlines()[-1]), "rows": []}
    for batch in map(int, args.batches.split(",")):
        prompts = [torch.randint(2, 128000, (64,), generator=gen).tolist() for _ in range(batch)]
        runs = {mode: decode(distilled, prompts, args.device, args.dtype, args.max_tokens, spec)
                for mode, spec in MODES.items()}
        plain = runs["plain"]
        for mode in ("chain", "tree"):
            same = sum(plain["tokens"][k] == runs[mode]["tokens"][k] for k in plain["tokens"])
            row = {"batch": batch, "mode": mode, "plain_tok_s": round(plain["tokens_per_s"], 1),
                   "spec_tok_s": round(runs[mode]["tokens_per_s"], 1),
                   "speedup": round(runs[mode]["tokens_per_s"] / plain["tokens_per_s"], 3),
                   "acceptance_rate": round(runs[mode]["acceptance_rate"], 3),
                   "mean_accepted_length": round(runs[mode]["mean_accepted_length"], 3),
                   "identical_requests": f"{same}/{batch}"}
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
