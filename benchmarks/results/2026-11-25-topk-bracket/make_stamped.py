"""Writes .ab/topk_coop_stamped.py: kernels/topk_cooperative.py with clock64 stamps per phase into a
DBG buffer (16 int64 a program), for ab_bracket.py's phase table. Run from the repository root."""

s = open('kernels/topk_cooperative.py').read()
s = s.replace("from .topk import", "from dsa_kernels.topk import").replace("from .triton_dot import", "from dsa_kernels.triton_dot import")
s = s.replace('''@triton.jit
def _meet(''', '''@triton.jit
def _stamp(dbg, i):
    r = tl.arange(0, 32)
    t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [r], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(dbg + i + r * 0, t, mask=r == 0)


@triton.jit
def _meet(''')


def ins(anchor, text, after=True):
    global s
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, anchor + text if after else text + anchor)


s = s.replace("bt_ptr, stride_bt, offs_ptr, NEXT_N,\n    K: tl.constexpr", "bt_ptr, stride_bt, offs_ptr, NEXT_N, dbg_ptr,\n    K: tl.constexpr")
ins("    part = tl.program_id(1)\n", "    dbg = dbg_ptr + (row * P + part) * 16\n    _stamp(dbg, 0)\n")
ins("        span = sample_hi - sample_lo\n", "        _stamp(dbg, 1 + (span > 12345.0).to(tl.int32) * 0)\n")
ins("        lo = bracket_lo - 1.0 / scale  # bin 0 for the keys below the bracket, 63 for those above\n", "        _stamp(dbg, 2 + (lo > 12345.0).to(tl.int32) * 0)\n")
ins("            tl.store(buf + part * BINS + bins, tl.histogram(bin, BINS, mask=live))\n", "            _stamp(dbg, tl.minimum(3 + 3 * rnd, 11))\n")
ins("            hists = tl.load(", "            _stamp(dbg, tl.minimum(4 + 3 * rnd, 11))\n", after=False)
ins("            going = (share > PAIR_CAP) & (share > need)\n", "            _stamp(dbg, tl.minimum(5 + 3 * rnd - 3, 11))\n")
ins("            tl.store(gather + PAIR_CAP + entry, pos, mask=live)\n", "            _stamp(dbg, 12)\n")
ins("            g = tl.arange(0, PAIR_CAP)\n", "            _stamp(dbg, 13)\n", after=False)
ins("        take = taken | (live & pick)\n", "        _stamp(dbg, 14)\n", after=False)
ins("        tl.store(out_row + slot, val.to(tl.int32), mask=take)\n", "        _stamp(dbg, 15)\n")
s = s.replace("offsets if offsets is not None else lengths, next_n,\n", "offsets if offsets is not None else lengths, next_n, DBG,\n")
s = s.replace("_counters: dict = {}", "DBG = None\n_counters: dict = {}")
open('.ab/topk_coop_stamped.py', 'w').write(s)
