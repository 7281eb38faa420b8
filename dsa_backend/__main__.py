"""Command line: python -m dsa_backend generate --model DIR --prompt TEXT [...]."""

from __future__ import annotations

import argparse
import json
import time

from dsa_backend.engine import FP8_WEIGHT_CHOICES
from dsa_backend.llm import LLM
from dsa_backend.sampling_params import SamplingParams


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dsa_backend")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions offline with the engine")
    gen.add_argument("--model", required=True)
    gen.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--page-size", type=int, default=64)
    gen.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    gen.add_argument("--fp8-weights", default="auto", choices=FP8_WEIGHT_CHOICES,
                     help="an FP8 checkpoint's weights: keep them e4m3, or dequantize (auto: keep on a GPU)")
    gen.add_argument("--tensor-parallel-size", type=int, default=1,
                     help="GPUs sharing each layer, one process each (from --device's GPU on)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    args = parser.parse_args(argv)

    llm = LLM(args.model, device=args.device, dtype=args.dtype, page_size=args.page_size,
              kv_cache_dtype=args.kv_cache_dtype, fp8_weights=args.fp8_weights,
              tensor_parallel_size=args.tensor_parallel_size)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    start = time.perf_counter()
    outputs = llm.generate(args.prompt, params)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason}, ensure_ascii=False))
        else:
            print(f"{prompt!r} -> {out.text!r} ({len(out.token_ids)} tokens, {out.finish_reason})")
    if not args.json:
        tokens = sum(len(o.token_ids) for o in outputs)
        print(f"{tokens} tokens in {elapsed:.2f} s")


if __name__ == "__main__":
    main()
