import sys, os, re, subprocess, tempfile, contextlib, io, importlib.util
sys.path.insert(0, "tests/kernels")
import torch, triton
import gluon_build as gb
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
spec = importlib.util.spec_from_file_location("dsa_kernels.indexer_ws", ".ab/indexer_ws.py")
ws = importlib.util.module_from_spec(spec); spec.loader.exec_module(ws)
def build(next_n, kpp, stages):
    kt = TensorDescriptor.from_tensor(torch.empty(4, 64, 128, dtype=torch.float8_e4m3fn), [1, 64, 128], gl.NVMMASharedLayout.get_default_for([1, 64, 128], gl.float8e4nv))
    st = TensorDescriptor.from_tensor(torch.empty(4, 64), [1, 64], gl.NVMMASharedLayout.get_default_for([1, 64], gl.float32))
    types = dict(q_ptr="*fp8e4nv", w_ptr="*fp32", keys=mangle_type(kt), scales=mangle_type(st), bt_ptr="*i32", lens_ptr="*i32", out_ptr="*fp32")
    fn = ws._ws_logits_kernel
    sig = {name: "constexpr" if p.is_constexpr else types.get(name, "i32") for name, p in zip(fn.arg_names, fn.params)}
    aligned = {"q_ptr", "w_ptr", "bt_ptr", "stride_bt", "lens_ptr", "out_ptr", "stride_out"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in aligned}
    consts = dict(H=64, PAGE=64, BLOCK=64, KEYS_PER_PROG=kpp, STAGES=stages, NEXT_N=next_n, CLEAN=True, EVICT="evict_last", num_warps=4)
    rep = io.StringIO()
    with contextlib.redirect_stdout(rep):
        k = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=gb.HOPPER, options=dict(num_warps=4))
    warn = [l.strip()[-100:] for l in rep.getvalue().splitlines() if "Potential" in l or "registers" in l or "spill" in l or "C75" in l]
    ptx = k.asm["ptx"]
    print((next_n, kpp, stages), "shared", k.metadata.shared, "maxnreg", re.findall(r"\.maxnreg \d+", ptx), "setmaxnreg", len(re.findall("setmaxnreg", ptx)), warn[:6], flush=True)
    if os.environ.get("SASS"):
        import triton.backends.nvidia as nv
        cub = tempfile.mktemp(suffix=".cubin"); open(cub, "wb").write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump"), "-sass", cub], capture_output=True, text=True).stdout
        open(os.environ["SASS"], "w").write(sass)
for a in sys.argv[1:]:
    try: build(*eval(a))
    except Exception as e: print(a, "FAILED", str(e)[-1500:])
