"""Where a decode forward's GPU time goes once the step is GPU-bound: the graph replay's GPU time,
and the kernels of the same forward run eagerly (torch.profiler), grouped by what they do.

    python3 forward_profile.py --model /tmp/v32 [--batch 32] [--prompt-len 2100] [--reps 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

# first match wins; names of our Triton / Gluon kernels, DeepGEMM, FlashMLA, cuBLAS and torch
GROUPS = [("fp8 gemm (experts)", r"grouped|expert|moe"), ("fp8 gemm", r"fp8_gemm|_fp8_|block_scaled|w8a8"),
          ("indexer", r"indexer|mqa_logits|paged_logits"), ("top-k", r"topk"),
          ("sparse mla", r"sparse_mla|flash_fwd|flashmla|splitkv|mla"), ("cublas gemm", r"gemm|sm90_xmma|cutlass|nvjet"),
          ("norm / rope / act", r"norm|rope|rotary|silu|act_and_mul|gelu"), ("copy / cast / index", r"copy|cast|index|gather|scatter|cat|fill"),
          ("reduce / sort", r"reduce|sort|argmax|max|sum|softmax")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=2100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * (a.prompt_len // 64 + 4),
                               max_running_requests=a.batch, max_num_batched_tokens=8192,
                               overlap_schedule=False))  # the batch below needs every token read back
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for i in range(a.batch):
        engine.add_request(f"r{i}", torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist(), params)
    seqs = list(engine.sequences.values())
    with torch.inference_mode():
        while any(not s.output_ids for s in seqs):
            engine.step()
        batch = ForwardBatch.build(ForwardMode.DECODE, [[s.output_ids[-1]] for s in seqs],
                                   [s.num_computed for s in seqs], [s.pages for s in seqs], 64, engine.device)
        engine.graphs.forward(batch)
        engine.model(batch, engine.cache)
        torch.cuda.synchronize()
        replay = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            engine.graphs.forward(batch)
            end.record()
            torch.cuda.synchronize()
            replay.append(start.elapsed_time(end))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.reps):
                engine.model(batch, engine.cache)
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels) / a.reps / 1e3
    groups: dict[str, float] = {}
    for e in kernels:
        name = next((g for g, pattern in GROUPS if re.search(pattern, e.key, re.I)), "other")
        groups[name] = groups.get(name, 0.0) + e.self_device_time_total / a.reps / 1e3
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:30]
    result = dict(gpu=torch.cuda.get_device_name(), model=a.model, batch=a.batch, prompt_len=a.prompt_len,
                  graph_replay_gpu_ms=round(statistics.median(replay), 3), eager_kernel_ms=round(total, 3),
                  kernels_a_forward=sum(e.count for e in kernels) / a.reps,
                  groups_ms={k: round(v, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
                  top=[(e.key[:100], round(e.self_device_time_total / a.reps / 1e3, 4), e.count // a.reps) for e in top])
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
