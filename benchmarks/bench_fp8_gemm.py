"""FP8 weights kept in e4m3: our block-scaled GEMMs (kernels/fp8_gemm.py) at DeepSeek-V3.2's linear
shapes and for its routed experts, against DeepGEMM's fp8_gemm_nt, torch's bf16 GEMMs of the same
weights, and the HBM roofline of the e4m3 weights, all measured in this run.

    python3 benchmarks/bench_fp8_gemm.py [--rows 1,4,32,128,1024,4096] [--tokens 1,4,32,128,512]
        [--experts 256] [--max-rows 2048] [--only dense|stacked|mlp|halves|experts] [--json out.json]

CUDA-graph times (benchmarks/graph_timing.py). A model reads each layer's weights once a step, from
HBM: the dense calls here cycle through enough copies of the weights (256 MiB of e4m3) that none is
still in L2 when its turn comes again. Columns, microseconds a call:
- ours: our quantization of the layer's input, then our GEMM;
- auto: dsa_kernels.fp8_linear as the engine calls it (DeepGEMM from DEEPGEMM_FP8_ROWS rows,
  with the activations quantized first);
- ours_gemm / deepgemm: the GEMMs alone on activations quantized before;
- bf16: F.linear on the bf16 weights (what dequantized weights cost);
- roofline: the e4m3 weights and scales read once at the copy bandwidth measured here.
The stacked rows time the attention's projections of one input as the model runs them, one
stacked GEMM (`stacked`), against a GEMM a layer (`apart`), both `auto`. The mlp rows time a
dense MLP (a shared expert's widths, and the dense layers') with gate and up in one GEMM and its
activation quantized in one pass, against a GEMM a projection with torch's SiLU and product
between. The halves rows calibrate each of the engine's FP8 GEMM shapes as the warm-up does
(dsa_kernels.calibrate_fp8_linear, up to --max-rows rows) and time, at each row count it splits,
DeepGEMM on the two row halves (`auto`) against its one call (`whole`) and ours. The experts
rows time one MoE layer's routed experts (dsa_backend/models/moe.py's Experts, 8 a token, random
routing) with e4m3 weights as the engine runs them (`auto`: DeepGEMM's grouped GEMM from
DEEPGEMM_GROUPED_PAIRS pairs, on runs aligned for it), on our grouped GEMM alone (`ours`), and
with bf16 weights; their roofline is the distinct experts' e4m3 weights, their TFLOP/s the three
GEMMs' products of every pair. Prints one JSON line a row, then the whole result.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import time
import types

import torch
import torch.nn.functional as F

import dsa_kernels
from bench_moe import copy_bandwidth
from dsa_backend.models.moe import Experts
from dsa_kernels import deepgemm_rows, dispatch, reference
from dsa_kernels.fp8_gemm import fp8_gemm, fp8_linear, quantize_act
from graph_timing import graph_ms
from report import emit

HIDDEN, INTERMEDIATE, TOP_K = 7168, 2048, 8
# DeepSeek-V3.2's linear layers (out, in), 128 heads: q_a, kv_a (with the rope part), q_b, o_proj,
# the indexer's wq_b and wk, a shared expert's gate (= up) and down, the dense layers' gate and down
DENSE = {"q_a_proj": (1536, 7168), "kv_a_proj_with_mqa": (576, 7168), "q_b_proj": (24576, 1536),
         "o_proj": (7168, 16384), "indexer.wq_b": (8192, 1536), "indexer.wk": (128, 7168),
         "shared.gate_proj": (2048, 7168), "shared.down_proj": (7168, 2048),
         "dense.gate_proj": (18432, 7168), "dense.down_proj": (7168, 18432)}
# Layers the model stacks into one GEMM of their shared input: from x, and from q_lora
STACKED = {"qkv_a_proj": ("q_a_proj", "indexer.wk", "kv_a_proj_with_mqa"), "q_heads_proj": ("q_b_proj", "indexer.wq_b")}
ROTATION_BYTES = 256 << 20


def _random_fp8(n: int, k: int, copies: int):
    w = [(torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn) for _ in range(copies)]
    s = [torch.rand(-(-n // 128), -(-k // 128), device="cuda") * 1e-3 + 1e-4 for _ in range(copies)]
    return w, s


def _cycling(fn, copies: int):
    """fn(i) over the copies in turn: each graph call records the next one."""
    turn = [0]

    def call():
        fn(turn[0] % copies)
        turn[0] += 1

    return call


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return round(((got.float() - want).norm() / want.norm()).item(), 5)


def _deepgemm():
    try:
        import deep_gemm

        return deep_gemm
    except Exception as exc:  # noqa: BLE001 - absent or broken: the column says why
        print(f"deep_gemm unavailable: {exc}", flush=True)
        return None


def dense_rows(rows: list[int], bandwidth: float) -> list[dict]:
    dg, out = _deepgemm(), []
    for name, (n, k) in DENSE.items():
        copies = max(1, -(-ROTATION_BYTES // (n * k)))
        w, s = _random_fp8(n, k, copies)
        w16 = [reference.dequantize_weight_ref(wi, si).bfloat16() for wi, si in zip(w, s)]
        weight_bytes = n * k + s[0].numel() * 4
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            a, a_scale = quantize_act(x)
            want = reference.fp8_linear_ref(a, a_scale, w[0], s[0])
            row = dict(section="dense", layer=name, n=n, k=k, m=m,
                       roofline_us=round(weight_bytes / bandwidth / 1e3, 2),
                       ours_error=_relative_error(fp8_linear(x, w[0], s[0]), want))
            fns = {"ours": _cycling(lambda i: fp8_linear(x, w[i], s[i]), copies),
                   "ours_gemm": _cycling(lambda i: fp8_gemm(a, a_scale, w[i], s[i]), copies),
                   "auto": _cycling(lambda i: dsa_kernels.fp8_linear(x, w[i], s[i]), copies),
                   "bf16": _cycling(lambda i: F.linear(x, w16[i]), copies)}
            if dg is not None:
                d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                try:
                    dg.fp8_gemm_nt((a, a_scale), (w[0], s[0]), d)
                    row["deepgemm_error"] = _relative_error(d, want)
                    fns["deepgemm"] = _cycling(lambda i: dg.fp8_gemm_nt((a, a_scale), (w[i], s[i]), d), copies)
                except Exception as exc:  # noqa: BLE001 - a refused shape is a result too
                    row["deepgemm_refused"] = str(exc)[:200]
            for col, fn in fns.items():
                row[f"{col}_us"] = round(graph_ms(fn, rep_ms=10, replays=5) * 1e3, 2)
            row["ours_over_bf16"] = round(row["bf16_us"] / row["ours_us"], 3)
            row["roofline_over_ours"] = round(row["roofline_us"] / row["ours_us"], 3)
            if "deepgemm_us" in row:
                row["ours_gemm_over_deepgemm"] = round(row["deepgemm_us"] / row["ours_gemm_us"], 3)
            row["ours_gemm_tflops"] = round(2 * m * n * k / row["ours_gemm_us"] / 1e6, 1)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def stacked_rows(rows: list[int], bandwidth: float) -> list[dict]:
    """The attention's projections of one input as the model runs them, stacked by rows into one
    GEMM (dsa_backend/weights.py, stacked_projections), against one GEMM a layer (`auto` both)."""
    out = []
    for name, parts in STACKED.items():
        k = DENSE[parts[0]][1]
        n = sum(DENSE[p][0] for p in parts)
        copies = max(1, -(-ROTATION_BYTES // (n * k)))
        apart = [_random_fp8(DENSE[p][0], k, copies) for p in parts]
        stacked = [(torch.cat([w[i] for w, _ in apart]), torch.cat([s[i] for _, s in apart])) for i in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            whole = dsa_kernels.fp8_linear(x, *stacked[0])
            each = torch.cat([dsa_kernels.fp8_linear(x, w[0], s[0]) for w, s in apart], dim=-1)
            row = dict(section="stacked", stack=name, parts=list(parts), n=n, k=k, m=m,
                       roofline_us=round((n * k + stacked[0][1].numel() * 4) / bandwidth / 1e3, 2),
                       stacked_equals_apart=bool(torch.equal(whole, each)),
                       relative_difference=_relative_error(whole, each.float()))
            fns = {"apart": _cycling(lambda i: [dsa_kernels.fp8_linear(x, w[i], s[i]) for w, s in apart], copies),
                   "stacked": _cycling(lambda i: dsa_kernels.fp8_linear(x, *stacked[i]), copies)}
            for col, fn in fns.items():
                row[f"{col}_us"] = round(graph_ms(fn, rep_ms=10, replays=5) * 1e3, 2)
            row["stacked_over_apart"] = round(row["apart_us"] / row["stacked_us"], 3)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def mlp_rows(rows: list[int], bandwidth: float) -> list[dict]:
    """A dense MLP as the model runs it (dsa_backend/models/layers.py, DenseMlp): gate and up in
    one GEMM, the activation quantized in the pass that computes it, the down projection on it
    (`stacked`), against a GEMM a projection with torch's SiLU and product between (`apart`)."""
    out = []
    for name in ("shared", "dense"):
        n, k = DENSE[f"{name}.gate_proj"]
        copies = max(1, -(-ROTATION_BYTES // (3 * n * k)))
        (gw, gs), (uw, us), (dw, ds) = _random_fp8(n, k, copies), _random_fp8(n, k, copies), _random_fp8(k, n, copies)
        gate_up = [(torch.cat([gw[i], uw[i]]), torch.cat([gs[i], us[i]])) for i in range(copies)]

        def apart(i, x):
            return dsa_kernels.fp8_linear(F.silu(dsa_kernels.fp8_linear(x, gw[i], gs[i]))
                                          * dsa_kernels.fp8_linear(x, uw[i], us[i]), dw[i], ds[i])

        def stacked(i, x):
            act = dsa_kernels.silu_mul_quantize(dsa_kernels.fp8_linear(x, *gate_up[i]))
            return dsa_kernels.fp8_linear_quantized(*act, dw[i], ds[i], x.dtype)

        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = dict(section="mlp", mlp=name, intermediate=n, hidden=k, m=m,
                       roofline_us=round(3 * (n * k + gs[0].numel() * 4) / bandwidth / 1e3, 2),
                       relative_difference=_relative_error(stacked(0, x), apart(0, x).float()))
            for col, fn in {"apart": apart, "stacked": stacked}.items():
                row[f"{col}_us"] = round(graph_ms(_cycling(lambda i: fn(i, x), copies), rep_ms=10, replays=5) * 1e3, 2)
            row["stacked_over_apart"] = round(row["apart_us"] / row["stacked_us"], 3)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def engine_shapes() -> dict[str, tuple[int, int]]:
    """The FP8 GEMMs' (N, K) as the engine runs them: the attention's stacks, o_proj, and each
    MLP with gate and up stacked."""
    shapes = {name: (sum(DENSE[p][0] for p in parts), DENSE[parts[0]][1]) for name, parts in STACKED.items()}
    shapes["o_proj"] = DENSE["o_proj"]
    for mlp in ("shared", "dense"):
        n, k = DENSE[f"{mlp}.gate_proj"]
        shapes[f"{mlp}.gate_up_proj"] = (2 * n, k)
        shapes[f"{mlp}.down_proj"] = DENSE[f"{mlp}.down_proj"]
    return shapes


def halves_rows(max_rows: int) -> list[dict]:
    """DeepGEMM's GEMM on row halves where the warm-up's calibration finds it faster
    (kernels/deepgemm_rows.py): per engine shape, the calibration's seconds and buckets, then at
    each split bucket's top `auto` (the halves) against DeepGEMM's one call (`whole`) and ours."""
    dg, out = _deepgemm(), []
    if dg is None:
        return out
    for name, (n, k) in engine_shapes().items():
        copies = max(1, -(-ROTATION_BYTES // (n * k)))
        w, s = _random_fp8(n, k, copies)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        split = dsa_kernels.calibrate_fp8_linear(w[0], s[0], max_rows)
        row = dict(section="halves", layer=name, n=n, k=k, max_rows=max_rows,
                   calibration_s=round(time.perf_counter() - t0, 2), split_rows=deepgemm_rows.row_ranges(split))
        print(json.dumps(row), flush=True)
        out.append(row)
        for b in sorted(split):
            m = min(b * deepgemm_rows.BUCKET, max_rows)
            a, a_scale = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            dg.fp8_gemm_nt((a, a_scale), (w[0], s[0]), d)
            row = dict(section="halves", layer=name, n=n, k=k, m=m,
                       bits_equal=bool(torch.equal(dsa_kernels.fp8_linear_quantized(a, a_scale, w[0], s[0]), d)))
            fns = {"whole": _cycling(lambda i: dg.fp8_gemm_nt((a, a_scale), (w[i], s[i]), d), copies),
                   "auto": _cycling(lambda i: dsa_kernels.fp8_linear_quantized(a, a_scale, w[i], s[i]), copies),
                   "ours": _cycling(lambda i: fp8_gemm(a, a_scale, w[i], s[i]), copies)}
            for col, fn in fns.items():
                row[f"{col}_us"] = round(graph_ms(fn, rep_ms=10, replays=5) * 1e3, 2)
            row["auto_over_whole"] = round(row["whole_us"] / row["auto_us"], 3)
            row["whole_tflops"] = round(2 * m * n * k / row["whole_us"] / 1e6, 1)
            row["auto_tflops"] = round(2 * m * n * k / row["auto_us"] / 1e6, 1)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


@contextlib.contextmanager
def _ours_only():
    """The routed experts on our grouped GEMM at every size (DeepGEMM's threshold out of reach)."""
    kept = dispatch.DEEPGEMM_GROUPED_PAIRS
    dispatch.DEEPGEMM_GROUPED_PAIRS = 1 << 62
    try:
        yield
    finally:
        dispatch.DEEPGEMM_GROUPED_PAIRS = kept


def experts_rows(tokens_list: list[int], experts: int, bandwidth: float) -> list[dict]:
    c = types.SimpleNamespace(n_routed_experts=experts, moe_intermediate_size=INTERMEDIATE, hidden_size=HIDDEN)
    with torch.device("meta"):
        fp8, bf16 = Experts(c), Experts(c)
    for name, (n, k) in {"w13": (2 * INTERMEDIATE, HIDDEN), "w2": (HIDDEN, INTERMEDIATE)}.items():
        # an expert at a time: the whole stack in float32 would not fit beside the rest
        w = torch.empty(experts, n, k, device="cuda", dtype=torch.float8_e4m3fn)
        scale = torch.rand(experts, -(-n // 128), -(-k // 128), device="cuda") * 1e-3 + 1e-4
        w16 = torch.empty(experts, n, k, device="cuda", dtype=torch.bfloat16)
        for e in range(experts):
            w[e] = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
            w16[e] = reference.dequantize_weight_ref(w[e], scale[e]).bfloat16()
        setattr(fp8, name, torch.nn.Parameter(w, requires_grad=False))
        fp8.register_parameter(name + "_scale_inv", torch.nn.Parameter(scale, requires_grad=False))
        setattr(bf16, name, torch.nn.Parameter(w16, requires_grad=False))
    expert_bytes = 3 * HIDDEN * INTERMEDIATE
    out = []
    for tokens in tokens_list:
        g = torch.Generator(device="cuda").manual_seed(tokens)
        ids = torch.rand(tokens, experts, generator=g, device="cuda").topk(TOP_K, dim=-1)[1]
        weights = torch.rand(tokens, TOP_K, generator=g, device="cuda")
        x = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
        active = ids.unique().numel()
        auto = fp8(x, ids, weights)
        with _ours_only():
            ours = fp8(x, ids, weights)
            ours_us = round(graph_ms(lambda: fp8(x, ids, weights)) * 1e3, 2)
        row = dict(section="experts", experts=experts, tokens=tokens, active_experts=active,
                   align=dsa_kernels.expert_alignment(tokens * TOP_K, (fp8.w13, fp8.w13_scale_inv),
                                                      (fp8.w2, fp8.w2_scale_inv)),
                   roofline_us=round(active * expert_bytes / bandwidth / 1e3, 2),
                   error_against_bf16=_relative_error(auto, bf16(x, ids, weights).float()),
                   error_auto_against_ours=_relative_error(auto, ours.float()),
                   auto_us=round(graph_ms(lambda: fp8(x, ids, weights)) * 1e3, 2), ours_us=ours_us,
                   bf16_us=round(graph_ms(lambda: bf16(x, ids, weights)) * 1e3, 2))
        row["auto_tflops"] = round(2 * tokens * TOP_K * expert_bytes / row["auto_us"] / 1e6, 1)
        row["auto_over_ours"] = round(row["ours_us"] / row["auto_us"], 3)
        row["auto_over_bf16"] = round(row["bf16_us"] / row["auto_us"], 3)
        row["roofline_over_auto"] = round(row["roofline_us"] / row["auto_us"], 3)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,32,128,1024,4096")
    ap.add_argument("--tokens", default="1,4,32,128,512,1024,2048,8192")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--max-rows", type=int, default=2048, help="halves: the rows calibrated up to")
    ap.add_argument("--only", choices=["dense", "stacked", "mlp", "halves", "experts"])
    ap.add_argument("--json")
    a = ap.parse_args()
    bandwidth = copy_bandwidth()
    rows = []
    if a.only in (None, "dense"):
        rows += dense_rows([int(m) for m in a.rows.split(",")], bandwidth)
    if a.only in (None, "stacked"):
        rows += stacked_rows([int(m) for m in a.rows.split(",")], bandwidth)
    if a.only in (None, "mlp"):
        rows += mlp_rows([int(m) for m in a.rows.split(",")], bandwidth)
    if a.only in (None, "halves"):
        rows += halves_rows(a.max_rows)
    if a.only in (None, "experts"):
        rows += experts_rows([int(t) for t in a.tokens.split(",")], a.experts, bandwidth)
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  libraries=dsa_kernels.available_backends("cuda"), copy_gb_s=round(bandwidth), rows=rows)
    emit(result, a.json)


if __name__ == "__main__":
    main()
