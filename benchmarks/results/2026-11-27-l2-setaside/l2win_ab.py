"""A/B: an L2 access-policy window (driver API, stream attribute) instead of / beside the
instruction hints: the logits persisting in a set-aside part of L2, or the key pool streaming.
Indexer (Gluon, next_n 1) + top-k (default dispatch) in one CUDA graph, captured on a stream that
carries the window. source .device/setup.sh && python3 benchmarks/results/2026-11-27-l2-setaside/l2win_ab.py"""
import ctypes, json, math, os, statistics, sys, time
sys.path.insert(0, "benchmarks")
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from dsa_kernels import indexer_gluon as ig, indexer_logits, topk
from dsa_kernels.device import num_sms
from dsa_kernels.host_math import cdiv

DEV, K, PAGE = "cuda", 2048, 64
torch.zeros(1, device=DEV)
SMS = num_sms(torch.device(DEV))
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), device=[], checks=[], rows=[])

cu = ctypes.CDLL("libcuda.so.1")


class Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class AttrValue(ctypes.Union):
    _fields_ = [("window", Window), ("pad", ctypes.c_char * 64)]


NORMAL, STREAMING, PERSISTING = 0, 1, 2
ATTR_WINDOW, LIMIT_PERSISTING = 1, 0x06


def ok(rc, what):
    assert rc == 0, f"{what}: CUresult {rc}"


def dev_attr(attr):
    v = ctypes.c_int()
    ok(cu.cuDeviceGetAttribute(ctypes.byref(v), attr, 0), f"attr {attr}")
    return v.value


L2, MAX_PERSIST, MAX_WINDOW = dev_attr(38), dev_attr(108), dev_attr(109)


def set_persisting(nbytes):
    ok(cu.cuCtxSetLimit(LIMIT_PERSISTING, ctypes.c_size_t(nbytes)), "set limit")
    v = ctypes.c_size_t()
    ok(cu.cuCtxGetLimit(ctypes.byref(v), LIMIT_PERSISTING), "get limit")
    return v.value


def set_window(stream, base, nbytes, ratio, hit, miss=NORMAL):
    val = AttrValue()
    val.window = Window(base, nbytes, ratio, hit, miss)
    ok(cu.cuStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), ATTR_WINDOW, ctypes.byref(val)), "stream attr")
    back = AttrValue()
    ok(cu.cuStreamGetAttribute(ctypes.c_void_p(stream.cuda_stream), ATTR_WINDOW, ctypes.byref(back)), "get attr")
    return dict(num_bytes=back.window.num_bytes, ratio=round(back.window.hitRatio, 4), hit=back.window.hitProp)


def graph_node_windows(graph):
    """num_bytes of each kernel node's window in the captured graph (does capture inherit it?)."""
    try:
        g = graph.raw_cuda_graph()
    except Exception as e:  # noqa: BLE001
        return f"no raw graph: {e}"
    count = ctypes.c_size_t(0)
    ok(cu.cuGraphGetNodes(ctypes.c_void_p(g), None, ctypes.byref(count)), "nodes count")
    nodes = (ctypes.c_void_p * count.value)()
    ok(cu.cuGraphGetNodes(ctypes.c_void_p(g), nodes, ctypes.byref(count)), "nodes")
    sizes = []
    for node in nodes[: min(4, count.value)]:
        kind = ctypes.c_int()
        ok(cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "type")
        if kind.value != 0:
            sizes.append(f"type {kind.value}")
            continue
        val = AttrValue()
        rc = cu.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), ATTR_WINDOW, ctypes.byref(val))
        sizes.append((rc, val.window.num_bytes, val.window.hitProp))
    return sizes


def timed(fn, stream, window, rep_ms=30.0, replays=10, inspect=False):
    """graph_ms of benchmarks/graph_timing.py, with the window set on the capture stream first."""
    with torch.cuda.stream(stream):
        fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            fn()
        e.record()
    torch.cuda.synchronize()
    calls = max(1, min(10000, int(rep_ms / max(s.elapsed_time(e) / 5, 1e-4))))
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    if hasattr(graph, "instantiate"):
        try:
            graph.instantiate()
        except Exception:  # noqa: BLE001
            pass
    nodes = graph_node_windows(graph) if inspect else None
    per = []
    for _ in range(replays):
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        per.append(s.elapsed_time(e) / calls)
    return 1000 * statistics.median(per), nodes


def eager_us(fn, stream, iters=300):
    with torch.cuda.stream(stream):
        for _ in range(20):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
    torch.cuda.synchronize()
    return 1000 * s.elapsed_time(e) / iters


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "l2win_ab.json"), "w"), indent=1)


def case(n, w, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    pages = n * math.ceil(w / PAGE)
    pool = torch.empty(pages + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages + 64, PAGE * 128, device=DEV, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages + 64, PAGE, device=DEV, generator=g) * 0.02 + 0.01).view(torch.uint8)
    table = torch.randperm(pool.shape[0], device=DEV, generator=g)[:pages].view(n, -1).int()
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV, generator=g) * 0.1
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, 64, 128], ig.KEY_TILE_LAYOUT)
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, 64], ig.SCALE_TILE_LAYOUT)
    cfg = ig.gluon_config(n, w, 1, SMS)
    out = torch.empty(n, w, device=DEV, dtype=torch.float32)
    committed_evict = ig._logits_eviction(out)

    def launch(evict):
        ig._paged_logits_kernel[(n, cdiv(w, cfg["KEYS_PER_PROG"]))](
            q, weights, key_tiles, scale_tiles, table, table.stride(0), table.shape[1], lens, out, out.stride(0), w,
            H=64, PAGE=PAGE, BLOCK=64, NEXT_N=1, TOKENS_PER_REQ=1, CLEAN=False, EVICT=evict, num_warps=4, **cfg)
    return launch, out, lens, table, pool, committed_evict


def flusher():
    src = torch.empty(1 << 25, device=DEV)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def main():
    log("device", l2=L2, max_persisting=MAX_PERSIST, max_window=MAX_WINDOW, sms=SMS)
    flush = flusher()
    plain_stream = torch.cuda.Stream()
    t_flush, _ = timed(flush, plain_stream, None)
    shapes = [(32, 32768), (16, 32768), (64, 32768), (128, 32768), (32, 131072), (8, 131072), (128, 131072)]
    shapes = [tuple(int(x) for x in s.split("x")) for s in os.environ["SHAPES"].split(",")] if "SHAPES" in os.environ else shapes
    for n, w in shapes:
        launch, out, lens, table, pool, committed = case(n, w, seed=n + w)
        logit_bytes = out.numel() * 4
        pool_bytes = pool.numel()
        persist = set_persisting(min(MAX_PERSIST, logit_bytes))
        set_persisting(0)
        # name: (stores' evict hint, window maker or None, persisting bytes)
        variants = {
            "committed": (committed, None, 0),
            "logits persisting": (committed, lambda s: set_window(s, out.data_ptr(), min(logit_bytes, MAX_WINDOW),
                                                                 min(1.0, persist / logit_bytes), PERSISTING), persist),
            "logits persisting, plain stores": ("", lambda s: set_window(s, out.data_ptr(), min(logit_bytes, MAX_WINDOW),
                                                                        min(1.0, persist / logit_bytes), PERSISTING), persist),
"set-aside only": (committed, None, persist),
            "keys streaming": (committed, lambda s: set_window(s, pool.data_ptr(), min(pool_bytes, MAX_WINDOW), 1.0,
                                                              STREAMING), 0),
        }
        streams = {}
        for name, (evict, make, limit) in variants.items():
            s = torch.cuda.Stream()
            got = make(s) if make else None
            streams[name] = s
            log("checks", shape=[n, w], variant=name, window=got, logit_bytes=logit_bytes, pool_bytes=pool_bytes,
                persisting=limit)
        ref = None

        def pair(evict):
            launch(evict)
            return topk.topk_transform(out, lens, K, topk.TRANSFORM_PAGED, block_table=table, page_size=PAGE)
        flushed_too = (n, w) in ((32, 32768), (128, 32768))
        names = list(variants)
        for r in range(3):
            for name in (names if r % 2 == 0 else names[::-1]):
                evict, make, limit = variants[name]
                set_persisting(limit)
                s = streams[name]
                with torch.cuda.stream(s):
                    got = pair(evict)
                torch.cuda.synchronize()
                if ref is None:
                    ref = got.sort(dim=1).values
                same = bool(torch.equal(got.sort(dim=1).values, ref))
                row = dict(shape=[n, w], variant=name, round=r, same=same)
                row["idx"], _ = timed(lambda: launch(evict), s, make)
                row["pair"], row["nodes"] = timed(lambda: pair(evict), s, make, inspect=r == 0)
                row["topk_behind"] = row["pair"] - row["idx"]
                row["share"] = row["topk_behind"] / row["idx"]
                if r == 0 and n * w >= 32 * 32768:
                    row["eager_pair"] = eager_us(lambda: pair(evict), s)
                if flushed_too:
                    row["idx_flushed"] = timed(lambda: (flush(), launch(evict)), s, make)[0] - t_flush
                    row["pair_flushed"] = timed(lambda: (flush(), pair(evict)), s, make)[0] - t_flush
                    row["share_flushed"] = (row["pair_flushed"] - row["idx_flushed"]) / row["idx_flushed"]
                cu.cuCtxResetPersistingL2Cache()
                set_persisting(0)
                log("rows", **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})


if __name__ == "__main__":
    main()
