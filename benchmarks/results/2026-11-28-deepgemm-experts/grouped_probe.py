"""Session 57 probe: DeepGEMM's m-grouped contiguous FP8 GEMM against ours for the routed experts.

python3 grouped_probe.py out.json
"""
import json
import sys
import traceback

import torch

sys.path.insert(0, "benchmarks")
import deep_gemm as dg  # noqa: E402

import dsa_kernels  # noqa: E402
from dsa_kernels.fp8_gemm import fp8_grouped_linear as ours  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

E, H, I, TOPK = 256, 7168, 2048, 8
torch.manual_seed(0)
out = {"gpu": torch.cuda.get_device_name(), "align": None, "rows": [], "errors": []}


def weights(n, k):
    w = torch.empty(E, n, k, device="cuda", dtype=torch.float8_e4m3fn)
    for e in range(E):
        w[e] = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    s = torch.rand(E, n // 128, k // 128, device="cuda") * 1e-3 + 1e-4
    return w, s


def layout(ends, p, groups, align):
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    padded = (counts + align - 1) // align * align
    pstart = torch.cumsum(padded, 0) - padded
    start = ends - counts
    m = -(-(p + min(groups, p) * (align - 1)) // align) * align
    row = torch.arange(p, device=ends.device)
    g = torch.searchsorted(ends, row, right=True)
    dest = pstart[g] + row - start[g]
    m_indices = torch.full((m,), -1, dtype=torch.int32, device=ends.device)
    m_indices[dest] = g.int()
    psum = (pstart + counts).int()
    return dest, m_indices, psum, m


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


try:
    align = dg.get_mk_alignment_for_contiguous_layout()
    out["align"] = align
    ws = {"w13": weights(2 * I, H), "w2": weights(H, I)}
    for tokens in [64, 256, 512, 1024, 2048, 4096, 8192]:
        g = torch.Generator(device="cuda").manual_seed(tokens)
        ids = torch.rand(tokens, E, generator=g, device="cuda").topk(TOPK, dim=-1)[1]
        order, ends = dsa_kernels.expert_runs(ids.flatten(), E)
        p = tokens * TOPK
        for name, (w, s) in ws.items():
            n, k = w.shape[1], w.shape[2]
            x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
            a, sa = dsa_kernels.quantize_act(x)
            a, sa = a[order // TOPK].contiguous(), sa[order // TOPK].contiguous()
            dest, m_indices, psum, m = layout(ends, p, E, align)
            a_pad = torch.zeros(m, k, device="cuda", dtype=torch.float8_e4m3fn)
            s_pad = torch.ones(m, k // 128, device="cuda")
            a_pad[dest], s_pad[dest] = a, sa
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row = dict(tokens=tokens, pairs=p, gemm=name, n=n, k=k, padded_rows=m)
            ref = ours(a, sa, w, s, ends)
            row["ours_us"] = round(graph_ms(lambda: ours(a, sa, w, s, ends)) * 1e3, 1)
            try:
                dg.m_grouped_fp8_gemm_nt_contiguous((a_pad, s_pad), (w, s), d, m_indices)
                row["dg_err"] = rel(d[dest], ref)
                row["dg_us"] = round(graph_ms(lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
                    (a_pad, s_pad), (w, s), d, m_indices)) * 1e3, 1)

                def full():
                    dd, mi, _, mm = layout(ends, p, E, align)
                    ap = torch.empty(mm, k, device="cuda", dtype=torch.float8_e4m3fn)
                    sp = torch.empty(mm, k // 128, device="cuda")
                    ap[dd], sp[dd] = a, sa
                    o = torch.empty(mm, n, device="cuda", dtype=torch.bfloat16)
                    dg.m_grouped_fp8_gemm_nt_contiguous((ap, sp), (w, s), o, mi)
                    return o[dd]
                row["dg_full_err"] = rel(full(), ref)
                row["dg_full_us"] = round(graph_ms(full) * 1e3, 1)
            except Exception as e:  # noqa: BLE001
                row["dg_error"] = repr(e)[:300]
            try:
                d2 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                dg.m_grouped_fp8_gemm_nt_contiguous((a_pad, s_pad), (w, s), d2, psum, use_psum_layout=True)
                row["psum_err"] = rel(d2[dest], ref)
                row["psum_us"] = round(graph_ms(lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
                    (a_pad, s_pad), (w, s), d2, psum, use_psum_layout=True)) * 1e3, 1)
            except Exception as e:  # noqa: BLE001
                row["psum_error"] = repr(e)[:300]
            flops = 2 * p * n * k
            for key in ("ours_us", "dg_us", "dg_full_us", "psum_us"):
                if key in row:
                    row[key.replace("_us", "_tflops")] = round(flops / row[key] / 1e6, 1)
            print(json.dumps(row), flush=True)
            out["rows"].append(row)
except Exception:  # noqa: BLE001
    out["errors"].append(traceback.format_exc())
    print(traceback.format_exc(), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
