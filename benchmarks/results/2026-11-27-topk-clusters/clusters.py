"""How many clusters of P one-launch top-k programs (16 warps, 128 registers) the device holds at once
(cuOccupancyMaxActiveClusters), for P = 2, 4, 8."""
import ctypes, importlib.util, sys
import torch
import dsa_kernels
from dsa_kernels import topk

spec = importlib.util.spec_from_file_location("dsa_kernels.ab_ck", ".ab/ck/ck.py")
ck = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ck)

class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]

class Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint), ("by", ctypes.c_uint),
                ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]

cuda = ctypes.CDLL("libcuda.so.1")
for n, w in [(32, 32768), (16, 32768), (32, 4096), (64, 32768)]:
    x = torch.randn(n, w, device="cuda")
    lens = torch.full((n,), w, device="cuda", dtype=torch.int32)
    table = torch.arange(n * w // 64, device="cuda", dtype=torch.int32).view(n, -1)
    parts = ck.parts_per_row(n, w, torch.cuda.get_device_properties(0).multi_processor_count)
    out = torch.empty(n, 2048, device="cuda", dtype=torch.int32)
    ck.cooperative_topk(x, lens, None, 2048, parts, out, topk.TRANSFORM_PAGED, table, 64, 1, None)
    torch.cuda.synchronize()
    ok = torch.equal(out, topk.topk_transform(x, lens, 2048, topk.TRANSFORM_PAGED, block_table=table, page_size=64))
    kernel = ck._topk_kernel.run(x, x.stride(0), lens, lens, lens, lens, lens, lens, lens, out, out.stride(0), table,
                                 table.stride(0), lens, 1, grid=(1,), warmup=True, K=2048, P=parts,
                                 SLICE=min(max(1 << (w // parts - 1).bit_length(), 256), 8192), CHUNKS=max(1, (w // parts) // 8192),
                                 SAMPLE=1024, PAIR_CAP=64, HAS_STARTS=False, PAGE=64, TRANSFORM=topk.TRANSFORM_PAGED,
                                 num_warps=ck._warps(min(w // parts, 8192)))
    kernel._init_handles()
    attr = Attr(id=4, x=parts, y=1, z=1)
    cfg = Config(gx=n * parts, gy=1, gz=1, bx=32 * kernel.metadata.num_warps, by=1, bz=1, smem=ck.rounds.SMEM_END, stream=None,
                 attrs=ctypes.pointer(attr), n=1)
    count = ctypes.c_int(-1)
    rc = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(kernel.function), ctypes.byref(cfg))
    print(f"clusters {n}x{w} parts {parts}: exact {ok}, max active clusters {count.value} (rc {rc}), needed {n}", flush=True)
