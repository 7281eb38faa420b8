"""Compile the cluster variants for sm_90 on this machine (Triton on PYTHONPATH): registers, spills, shared."""
import contextlib, importlib.util, io, os, re, sys
os.environ["TRITON_ALWAYS_COMPILE"] = "1"
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import dsa_kernels
from dsa_kernels import topk_cooperative as base

def load(name, path):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.ab_{name}", path)
    m = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m

mods = {"base": base}
for n in sys.argv[1:]:
    mods[n] = load(n, f".ab/ck/{n}.py")
types = dict(logits_ptr="*fp32", starts_ptr="*i32", lens_ptr="*i32", counters="*i32", exch_ptr="*i32",
             gather_ptr="*i32", list_ptr="*i32", flags_ptr="*i32", out_ptr="*i32", bt_ptr="*i32", offs_ptr="*i32")
for slice_, chunks, P in [(8192, 1, 4), (4096, 1, 8), (8192, 2, 2), (512, 1, 64)]:
    for name, m in mods.items():
        fn = m._topk_kernel
        consts = dict(K=2048, P=P, SLICE=slice_, CHUNKS=chunks, SAMPLE=1024, PAIR_CAP=64, HAS_STARTS=False, PAGE=64, TRANSFORM=1)
        sig = {n: "constexpr" if p.is_constexpr else types.get(n, "i32") for n, p in zip(fn.arg_names, fn.params)}
        rep = io.StringIO()
        with contextlib.redirect_stdout(rep), contextlib.redirect_stderr(rep):
            k = triton.compile(ASTSource(fn, sig, consts, {}), target=GPUTarget("cuda", 90, 64), options=dict(num_warps=m._warps(slice_)))
        ptx = k.asm["ptx"]
        print(name, slice_, chunks, P, "regs", re.findall(r"Used (\d+) registers", rep.getvalue()), "spills",
              re.findall(r"(\d+) bytes spill stores", rep.getvalue()), "shared", k.metadata.shared,
              "cluster ops", ptx.count("barrier.cluster"), "st.shared::cluster", ptx.count("st.shared::cluster"), flush=True)
