"""Writes .ab/topk_coop_stamped.py: kernels/topk_cooperative.py with clock64 stamps per phase into a
DBG buffer (32 int64 a program), for ab_list.py's phase table. Run from the repository root.
Stamps: 0 start, 1 loads and sample, 2 bracket, 3 first round's bins and the list, 4 / 5 before /
after the first meeting, 6 first pick, 7 / 8 before / after the second round's meeting (if any),
9 rounds done, 10 gather stores, 11 gather meeting, 12 pairwise rank, 13 output, 14 the path (1 list);
within the list's making: 15 the first round's bins and the list's count, 17 the positions on the list
stored, 18 the list and its logits loaded back, 19 the histogram."""

s = open("kernels/topk_cooperative.py").read()
s = s.replace("from .topk import", "from dsa_kernels.topk import").replace("from .triton_dot import", "from dsa_kernels.triton_dot import")
s = s.replace('''@triton.jit
def _meet(''', '''@triton.jit
def _stamp(dbg, i, dep=0):
    r = tl.arange(0, 32)
    t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [r + dep * 0], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(dbg + i + r * 0, t, mask=r == 0)


@triton.jit
def _meet(''')


def sub(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)


sub("def _exchange(hist, exch, rnd, counter, part, need, P: tl.constexpr):", "def _exchange(hist, exch, rnd, counter, part, need, dbg, P: tl.constexpr):")
sub("    tl.store(buf + part * BINS + bins, hist)\n    _meet(counter, P)\n",
    "    tl.store(buf + part * BINS + bins, hist)\n    if rnd < 2:\n        _stamp(dbg, 4 + 3 * rnd)\n    _meet(counter, P)\n"
    "    if rnd < 2:\n        _stamp(dbg, 5 + 3 * rnd)\n")
sub("exch, rnd, counter, part, need, P)", "exch, rnd, counter, part, need, dbg, P)")
sub("_exchange(hist, exch, 0, counter, part, K, P)", "_exchange(hist, exch, 0, counter, part, K, dbg, P)")
sub("    exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N,\n    WIDTH",
    "    exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N, dbg,\n    WIDTH")
sub("NEXT_N, LIST, P, PAIR_CAP", "NEXT_N, dbg, LIST, P, PAIR_CAP")
sub("NEXT_N, SLICE, P, PAIR_CAP", "NEXT_N, dbg, SLICE, P, PAIR_CAP")
sub("    key = _ordered_key(x)\n    if share > need:", "    _stamp(dbg, 9, need)\n    key = _ordered_key(x)\n    if share > need:")
sub("        tl.store(gather + PAIR_CAP + entry, pos, mask=live)\n        _meet(counter, P)\n",
    "        tl.store(gather + PAIR_CAP + entry, pos, mask=live)\n        _stamp(dbg, 10)\n        _meet(counter, P)\n        _stamp(dbg, 11)\n")
sub("    take = taken | (live & pick)\n", "    _stamp(dbg, 12, tl.sum(pick.to(tl.int32), axis=0))\n    take = taken | (live & pick)\n")
sub("    tl.store(out_row + slot, val.to(tl.int32), mask=take)\n", "    tl.store(out_row + slot, val.to(tl.int32), mask=take)\n    _stamp(dbg, 13, tl.sum(slot, axis=0))\n")
sub("bt_ptr, stride_bt, offs_ptr, NEXT_N,\n    K: tl.constexpr", "bt_ptr, stride_bt, offs_ptr, NEXT_N, dbg_ptr,\n    K: tl.constexpr")
sub("    part = tl.program_id(1)\n", "    part = tl.program_id(1)\n    dbg = dbg_ptr + (row * P + part) * 32\n    _stamp(dbg, 0)\n")
sub("        span = sample_hi - sample_lo\n", "        span = sample_hi - sample_lo\n        _stamp(dbg, 1, tl.sum(x, axis=0) + span)\n")
sub("        lo = bracket_lo - 1.0 / scale  # bin 0 for the keys below the bracket, 63 for those above\n",
    "        lo = bracket_lo - 1.0 / scale  # bin 0 for the keys below the bracket, 63 for those above\n        _stamp(dbg, 2, lo)\n")
sub("        b, above, share, above_before, share_before = _exchange(hist, exch, 0,",
    "        _stamp(dbg, 3, tl.sum(hist, axis=0))\n        tl.store(dbg + 14, on_list.to(tl.int64))\n        b, above, share, above_before, share_before = _exchange(hist, exch, 0,")
sub("        need = K - above\n", "        need = K - above\n        _stamp(dbg, 6, need)\n")
sub("            bt.stride(0) if block_table is not None else 0, offsets if offsets is not None else lengths, next_n,\n",
              "            bt.stride(0) if block_table is not None else 0, offsets if offsets is not None else lengths, next_n, DBG,\n")
sub("        at = tl.arange(0, LIST)\n", "        at = tl.arange(0, LIST)\n        _stamp(dbg, 15, n_listed)\n")
sub("            tl.debug_barrier()  # the program's stores before its loads\n", "            _stamp(dbg, 17)\n            tl.debug_barrier()  # the program's stores before its loads\n")
sub("            lx = tl.load(base + lpos, mask=in_list, other=0.0)\n", "            lx = tl.load(base + lpos, mask=in_list, other=0.0)\n            _stamp(dbg, 18, tl.sum(lx, axis=0))\n")
sub("            hist = tl.histogram(lbin, BINS, mask=in_list) + tl.where(tl.arange(0, BINS) == 0, below, 0)\n",
    "            hist = tl.histogram(lbin, BINS, mask=in_list) + tl.where(tl.arange(0, BINS) == 0, below, 0)\n            _stamp(dbg, 19, tl.sum(hist, axis=0))\n")
s += "\nDBG = None  # the stamps' buffer, set by the driver\n"
open(".ab/topk_coop_stamped.py", "w").write(s)
