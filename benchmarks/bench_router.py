"""The MoE router, one layer's worth: PyTorch ops (the weight cast to float32 each call, as before
it was kept in float32, then `route_ref`) against the float32 weight and `dsa_kernels.route`; and
the chosen pairs put in runs by expert, PyTorch's stable sort (`expert_runs_ref`) against
`dsa_kernels.expert_runs`.

    python3 benchmarks/bench_router.py [--tokens 1,32,128,512]

At DeepSeek-V3.2's shapes (hidden 7168, 256 experts in 8 groups, 4 kept, 8 a token) and GLM-5's
(hidden 6144, 256 experts, one group). Each side runs 20 calls in a CUDA graph, as a decode step
replays them, timed over replays; the experts each side picks are compared too. Prints one JSON
line.
"""

from __future__ import annotations

import argparse
import datetime

import torch
import torch.nn.functional as F

import dsa_kernels
from dsa_kernels.reference import expert_runs_ref, route_ref
from report import emit

# name -> (hidden, experts, groups, groups kept, k, renormalize, scaling)
MODELS = {"deepseek_v32": (7168, 256, 8, 4, 8, True, 2.5), "glm5": (6144, 256, 1, 1, 8, True, 2.5)}
CALLS = 20


def graph_ms(fn, replays: int = 50) -> float:
    """Per-call time of fn() run CALLS times in one CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and warm on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * CALLS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,32,128,512")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for name, (hidden, experts, groups, kept, k, renormalize, scaling) in MODELS.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        weight = torch.randn(experts, hidden, device="cuda", generator=gen).mul_(hidden**-0.5)
        weight_bf16, weight_fp32 = weight.bfloat16(), weight.bfloat16().float()
        bias = torch.randn(experts, device="cuda", generator=gen) * 0.1
        for tokens in map(int, a.tokens.split(",")):
            x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()

            def torch_ops():
                return route_ref(F.linear(x.float(), weight_bf16.float()), bias, groups, kept, k, renormalize, scaling)

            def kernel():
                return dsa_kernels.route(F.linear(x.float(), weight_fp32), bias, groups, kept, k, renormalize, scaling)

            ids_ref, ids_ours = torch_ops()[1], kernel()[1]
            same = torch.equal(ids_ref.sort(dim=1)[0], ids_ours.sort(dim=1)[0])
            t_torch, t_kernel = graph_ms(torch_ops), graph_ms(kernel)
            t_gemm = graph_ms(lambda: F.linear(x.float(), weight_fp32))
            rows.append(dict(model=name, tokens=tokens, torch_ms=round(t_torch, 5), kernel_ms=round(t_kernel, 5),
                             gemm_alone_ms=round(t_gemm, 5), speedup=round(t_torch / t_kernel, 2),
                             same_experts=same))
            print(rows[-1], flush=True)
            pairs = ids_ours.flatten()
            same_runs = all(torch.equal(a, b) for a, b in zip(expert_runs_ref(pairs, experts),
                                                               dsa_kernels.expert_runs(pairs, experts)))
            t_sort = graph_ms(lambda: expert_runs_ref(pairs, experts))
            t_runs = graph_ms(lambda: dsa_kernels.expert_runs(pairs, experts))
            rows.append(dict(model=name, tokens=tokens, part="expert runs", torch_ms=round(t_sort, 5),
                             kernel_ms=round(t_runs, 5), speedup=round(t_sort / t_runs, 2), same_runs=same_runs))
            print(rows[-1], flush=True)
    emit(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), rows=rows), a.json)


if __name__ == "__main__":
    main()
