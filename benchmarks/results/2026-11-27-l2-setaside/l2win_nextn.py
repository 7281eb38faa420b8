"""The L2 persisting window on the logits at next_n 1 / 2 / 4, ours (official path) and DeepGEMM,
the window set on every kernel node of the captured graph (so DeepGEMM's own output gets it too).
source .device/setup.sh && python3 benchmarks/results/2026-11-27-l2-setaside/l2win_nextn.py"""
import ctypes, json, math, os, statistics, sys, time
sys.path.insert(0, "benchmarks/results/2026-11-27-l2-setaside")
import torch
from l2win_ab import cu, ok, AttrValue, Window, set_persisting, MAX_PERSIST, MAX_WINDOW, L2, PERSISTING, NORMAL, ATTR_WINDOW
from dsa_kernels import dispatch, indexer_logits

DEV, PAGE = "cuda", 64
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), device=dict(l2=L2, max_persisting=MAX_PERSIST),
         rows=[], notes=[])


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "l2win_nextn.json"), "w"), indent=1)


def node_windows(graph, base, nbytes, ratio):
    g = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    ok(cu.cuGraphGetNodes(g, None, ctypes.byref(count)), "count")
    nodes = (ctypes.c_void_p * count.value)()
    ok(cu.cuGraphGetNodes(g, nodes, ctypes.byref(count)), "nodes")
    val = AttrValue()
    val.window = Window(base, nbytes, ratio, PERSISTING, NORMAL)
    kernels = 0
    for node in nodes:
        kind = ctypes.c_int()
        ok(cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "type")
        if kind.value == 0:
            ok(cu.cuGraphKernelNodeSetAttribute(ctypes.c_void_p(node), ATTR_WINDOW, ctypes.byref(val)), "set node")
            kernels += 1
    return kernels


def graph_us(fn, window, rep_ms=30.0, replays=10):
    """window: False, True (persisting window on every kernel node + set-aside), or "limit" (the
    set-aside alone: do the kernels' evict_last stores use it?)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = fn()
        nbytes = out.untyped_storage().nbytes()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(5):
            fn()
        b.record()
    torch.cuda.synchronize()
    calls = max(1, min(10000, int(rep_ms / max(a.elapsed_time(b) / 5, 1e-4))))
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    addrs = set()
    with torch.cuda.graph(graph, stream=s):
        for _ in range(calls):
            addrs.add(fn().untyped_storage().data_ptr())
    info = dict(addrs=len(addrs), nbytes=nbytes)
    if window == "limit":
        info["persisting"] = set_persisting(min(MAX_PERSIST, nbytes))
    elif window:
        ratio = min(1.0, MAX_PERSIST / nbytes)
        set_persisting(min(MAX_PERSIST, nbytes))
        info["ratio"] = round(ratio, 3)
        info["kernel_nodes"] = node_windows(graph, min(addrs), min(nbytes, MAX_WINDOW), ratio)
    graph.instantiate()
    per = []
    for _ in range(replays):
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        per.append(a.elapsed_time(b) / calls)
    del graph
    cu.cuCtxResetPersistingL2Cache()
    set_persisting(0)
    return round(1000 * statistics.median(per), 2), info


MODES = tuple({"0": False, "1": True, "limit": "limit"}[m] for m in os.environ.get("MODES", "0,1").split(","))
KERNELS = os.environ.get("KERNELS", "ours,deepgemm").split(",")


def main():
    pool = torch.empty(128 * 2048 + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pool.shape[0], PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pool.shape[0], PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
    dg = dispatch._library("deep_gemm")
    log("notes", deep_gemm=dg is not None)
    shapes = [(32, 32768), (128, 32768), (32, 131072), (128, 4096), (64, 32768)]
    for batch, ctx in shapes:
        for next_n in (1, 2, 4):
            pages_per = math.ceil(ctx / PAGE)
            table = torch.randperm(pool.shape[0], device=DEV)[: batch * pages_per].view(batch, pages_per).int()
            seq = torch.full((batch,), ctx, device=DEV)
            lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
            q = torch.randn(batch * next_n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
            w = torch.randn(batch * next_n, 64, device=DEV) * 0.1
            fns = {"ours": lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False)}
            if dg is not None and next_n < 4:
                fns["deepgemm"] = lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False)
            logit_bytes = batch * next_n * ctx * 4
            windows = MODES if logit_bytes <= MAX_PERSIST else (False,)
            runs = [(k, wdw) for k in fns for wdw in windows if k in KERNELS]
            for r in range(3):
                for kernel, wdw in (runs if r % 2 == 0 else runs[::-1]):
                    us, info = graph_us(fns[kernel], wdw)
                    log("rows", batch=batch, ctx=ctx, next_n=next_n, kernel=kernel, window=wdw, round=r, us=us, **info)


if __name__ == "__main__":
    main()
