"""Device benchmark: distil the MTP layer of a tiny checkpoint, then plain vs MTP decoding.

    python3 benchmarks/bench_spec.py --out $OUT [--train-steps 400]

Reports, per batch size, output tokens/s with and without speculation (same run, same engine
settings), mean accepted length per verify step, and whether the tokens matched plain decoding.
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


def run(model: str, prompts, dtype: str, spec_steps: int | None) -> dict:
    spec = dict(speculative_algorithm="mtp", speculative_num_steps=spec_steps) if spec_steps else {}
    engine = Engine(EngineArgs(model=model, dtype=dtype, num_kv_pages=1024, **spec))
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts[:2]):  # warm-up
        engine.add_request(f"w{i}", p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_work():
        engine.step()
    tokens = {f"r{i}": [] for i in range(len(prompts))}
    finals = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start, steps = time.perf_counter(), 0
    while engine.has_work():
        steps += 1
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                finals[out.request_id] = out
    elapsed = time.perf_counter() - start
    drafted = sum(o.num_draft_tokens for o in finals.values())
    accepted = sum(o.num_accepted_draft_tokens for o in finals.values())
    verifies = drafted / spec_steps if spec_steps else 0
    return {"tokens": tokens, "tokens_per_s": sum(map(len, tokens.values())) / elapsed, "steps": steps,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": 1 + accepted / verifies if verifies else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    base, distilled = "/tmp/spec-tiny", "/tmp/spec-tiny-mtp"
    py = sys.executable
    subprocess.run([py, "-m", "dsa_backend.tools.make_checkpoint", "--arch", "deepseek_v32", "--preset", "tiny",
                    "--out", base], check=True)
    t0 = time.perf_counter()
    train = subprocess.run([py, "-m", "dsa_backend.tools.train_mtp", "--model", base, "--out", distilled,
                            "--steps", str(args.train_steps), "--sequences", "256", "--batch", "16",
                            "--new-tokens", "64", "--lr", "3e-3", "--device", "cuda"], capture_output=True, text=True)
    if train.returncode:
        sys.exit(f"train_mtp failed:\n{train.stderr[-3000:]}")
    print(train.stderr[-1500:], train.stdout, f"training took {time.perf_counter() - t0:.0f} s", flush=True)
    gen = torch.Generator().manual_seed(5)
    results = {"train": json.loads(train.stdout.strip().splitlines()[-1]), "rows": []}
    for batch in (1, 8, 32):
        prompts = [torch.randint(2, 128000, (64,), generator=gen).tolist() for _ in range(batch)]
        plain = run(distilled, prompts, args.dtype, None)
        spec = run(distilled, prompts, args.dtype, 2)
        same = sum(plain["tokens"][k] == spec["tokens"][k] for k in plain["tokens"])
        row = {"batch": batch, "plain_tok_s": plain["tokens_per_s"], "mtp_tok_s": spec["tokens_per_s"],
               "speedup": spec["tokens_per_s"] / plain["tokens_per_s"], "acceptance_rate": spec["acceptance_rate"],
               "mean_accepted_length": spec["mean_accepted_length"], "identical_requests": f"{same}/{batch}"}
        print(json.dumps(row), flush=True)
        results["rows"].append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
