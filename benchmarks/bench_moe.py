"""Routed experts at DeepSeek-V3.2's widths: the grouped GEMMs of dsa_backend/models/moe.py against a
loop over the experts a batch routes to (what the engine ran until the forty-eighth session) and
the HBM roofline of the experts' weights, measured in the same run.

    python3 benchmarks/bench_moe.py [--experts 256] [--tokens 1,8,32,128,512,2048,8192] [--json out.json]

One MoE layer's routed experts (hidden 7168, moe_intermediate 2048, 8 experts a token, bf16
weights), random routing. Each call is timed alone with CUDA events around it (the loop reads
expert ids back to the host, so neither is captured in a graph), median of --repeats. The roofline
is the distinct experts' weights (3 x 7168 x 2048 x 2 bytes each) read once at the copy bandwidth.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import types

import torch
import torch.nn.functional as F

from dsa_backend.models.moe import Experts
from report import emit

HIDDEN, INTERMEDIATE, TOP_K = 7168, 2048, 8


def loop_over_experts(m: Experts, x, ids, weights) -> torch.Tensor:
    """The engine's experts before the grouped GEMMs: one expert at a time, a host read each."""
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        token, slot = torch.where(ids == expert)
        gate, up = F.linear(x[token], m.w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, m.w2[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def time_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, read + write, GB/s."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 10)
    return 2 * src.numel() * 2 / ms / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--tokens", default="1,8,32,128,512,2048,8192")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    c = types.SimpleNamespace(n_routed_experts=a.experts, moe_intermediate_size=INTERMEDIATE, hidden_size=HIDDEN)
    m = Experts(c).to("cuda", torch.bfloat16)
    for p in m.parameters():
        p.data.normal_(0, p.shape[-1] ** -0.5)
    bandwidth = copy_bandwidth()
    expert_bytes = 3 * HIDDEN * INTERMEDIATE * 2
    rows = []
    for tokens in map(int, a.tokens.split(",")):
        g = torch.Generator(device="cuda").manual_seed(tokens)
        ids = torch.rand(tokens, a.experts, generator=g, device="cuda").topk(TOP_K, dim=-1)[1]
        weights = torch.rand(tokens, TOP_K, generator=g, device="cuda")
        x = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
        grouped, loop = m(x, ids, weights), loop_over_experts(m, x, ids, weights)
        error = ((grouped.float() - loop.float()).norm() / loop.float().norm()).item()
        active = ids.unique().numel()
        row = dict(tokens=tokens, active_experts=active, roofline_ms=round(active * expert_bytes / bandwidth / 1e6, 3),
                   grouped_ms=round(time_ms(lambda: m(x, ids, weights), a.repeats), 3),
                   loop_ms=round(time_ms(lambda: loop_over_experts(m, x, ids, weights), a.repeats), 3),
                   relative_error=round(error, 5))
        row["grouped_over_loop"] = round(row["grouped_ms"] / row["loop_ms"], 3)
        row["roofline_over_grouped"] = round(row["roofline_ms"] / row["grouped_ms"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  experts=a.experts, copy_gb_s=round(bandwidth), rows=rows)
    emit(result, a.json)


if __name__ == "__main__":
    main()
