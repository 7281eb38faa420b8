"""Writes the cluster variants of the one-launch top-k into .ab/: ck.py / ck_rounds.py (the row's
programs one thread-block cluster: meetings at barrier.cluster, histograms and the gathered keys
pushed into every peer's shared memory) and cb.py / cb_rounds.py (cluster barrier only, buffers in
global memory)."""
import re, sys
src_r = open("kernels/topk_rounds.py").read()
src_c = open("kernels/topk_cooperative.py").read()

HELPERS = '''
MAX_CLUSTER = tl.constexpr(8)  # rows of up to 8 programs are one cluster (the portable limit)
DSMEM = tl.constexpr(__DSMEM__)
EXCH_AT = tl.constexpr(32768)  # shared-memory offset of the exchange buffers (past Triton's own, checked at launch)
GATHER_AT = tl.constexpr(32768 + 2 * 8 * 64 * 4)
SMEM_END = 32768 + 2 * 8 * 64 * 4 + 2 * 64 * 4


@triton.jit
def cluster_arrive(P: tl.constexpr):
    """The start of the row's programs, said early (relaxed); cluster_wait before the first push."""
    if (P > 1) and (P <= MAX_CLUSTER):
        tl.inline_asm_elementwise("barrier.cluster.arrive.relaxed.aligned;\\n\\tmov.u32 $0, 0;", "=r,r",
                                  [tl.program_id(0)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_wait(P: tl.constexpr):
    if DSMEM and (P > 1) and (P <= MAX_CLUSTER):
        tl.inline_asm_elementwise("barrier.cluster.arrive.relaxed.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;\\n\\tmov.u32 $0, 0;", "=r,r",
                                  [tl.program_id(0)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _peer_addr(offset, peer):
    """The shared::cluster address of `offset` in CTA `peer`'s shared memory."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 a; mov.u32 a, global_smem; add.u32 a, a, $1; mapa.shared::cluster.u32 $0, a, $2; }",
        "=r,r,r", [offset, peer], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _push(addr, value, mask):
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.shared::cluster.b32 [$1], $2; } mov.b32 $0, 0;", "=r,r,r,r",
        [addr, value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _smem_load(offset):
    return tl.inline_asm_elementwise(
        "{ .reg .b32 a; mov.u32 a, global_smem; add.u32 a, a, $1; ld.shared.b32 $0, [a]; }", "=r,r",
        [offset], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def push_all(offset, value, mask, P: tl.constexpr):
    """value[i] to offset[i] (bytes) of every program of the row's shared memory, where mask[i]."""
    for peer in tl.static_range(P):
        base = _peer_addr(tl.zeros((), tl.int32), tl.zeros((), tl.int32) + peer)
        _push(base + offset, value, mask)
'''

r = src_r.replace("VALUE_ROUNDS = tl.constexpr(3)\n", "VALUE_ROUNDS = tl.constexpr(3)\n" + HELPERS)
# the meeting
r = r.replace('''    tl.debug_barrier()  # every thread's stores come before the release below
    if P > 1:''', '''    if (P > 1) and (P <= MAX_CLUSTER):
        tl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;\\n\\t"
                                  "mov.u32 $0, 0;", "=r,r", [tl.program_id(0)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.debug_barrier()  # every thread's stores come before the release below
    if (P > 1) and (P > MAX_CLUSTER):''')
r = r.replace('''    else:
        tl.debug_barrier()''', '''    else:
        tl.debug_barrier()''')
# exchange through shared memory
r = r.replace('''    buf = exch + (rnd % 2) * (P * BINS)
    tl.store(buf + part * BINS + bins, hist)
    meet(counter, P)
    hists = tl.load(buf + parts[:, None] * BINS + bins[None, :])''', '''    if DSMEM and (P > 1) and (P <= MAX_CLUSTER):
        at = EXCH_AT + (rnd % 2) * (P * BINS * 4)
        push_all(at + (part * BINS + bins) * 4, hist, bins < BINS, P)
        meet(counter, P)
        hists = _smem_load(at + (parts[:, None] * BINS + bins[None, :]) * 4)
    else:
        buf = exch + (rnd % 2) * (P * BINS)
        tl.store(buf + part * BINS + bins, hist)
        meet(counter, P)
        hists = tl.load(buf + parts[:, None] * BINS + bins[None, :])''')
# gathered keys
r = r.replace('''def last_taken(gather, share, need, first, PAIR_CAP: tl.constexpr):''',
              '''def last_taken(gather, share, need, first, PAIR_CAP: tl.constexpr, P: tl.constexpr):''')
r = r.replace('''    gk = tl.load(gather + g, mask=ok, other=0).to(tl.uint32, bitcast=True)
    gp = tl.load(gather + PAIR_CAP + g, mask=ok, other=0)''', '''    if DSMEM and (P > 1) and (P <= MAX_CLUSTER):
        gk = tl.where(ok, _smem_load(GATHER_AT + g * 4), 0).to(tl.uint32, bitcast=True)
        gp = tl.where(ok, _smem_load(GATHER_AT + (PAIR_CAP + g) * 4), 0)
    else:
        gk = tl.load(gather + g, mask=ok, other=0).to(tl.uint32, bitcast=True)
        gp = tl.load(gather + PAIR_CAP + g, mask=ok, other=0)''')
old_g = '''        _scatter(gather + entry, key.to(tl.int32, bitcast=True), live)
        _scatter(gather + PAIR_CAP + entry, pos, live)
        meet(counter, P)
        thr_key, thr_pos, chosen_before = last_taken(gather, share, need, first, PAIR_CAP)'''
assert old_g in r
r = r.replace(old_g, '''        gather_keys(gather, entry, key.to(tl.int32, bitcast=True), pos, live, PAIR_CAP, P)
        meet(counter, P)
        thr_key, thr_pos, chosen_before = last_taken(gather, share, need, first, PAIR_CAP, P)''')
r = r.replace('''@triton.jit
def last_taken(''', '''@triton.jit
def gather_keys(gather, entry, key, pos, live, PAIR_CAP: tl.constexpr, P: tl.constexpr):
    """The live keys and their positions to entry of the row's gather buffer (every program's
    shared memory, or global memory)."""
    if DSMEM and (P > 1) and (P <= MAX_CLUSTER):
        push_all(GATHER_AT + entry * 4, key, live, P)
        push_all(GATHER_AT + (PAIR_CAP + entry) * 4, pos, live, P)
    else:
        _scatter(gather + entry, key, live)
        _scatter(gather + PAIR_CAP + entry, pos, live)


@triton.jit
def last_taken(''')

c = src_c
c = c.replace("from . import topk_rounds as rounds\n", '''import importlib.util as _util, os as _os, sys as _sys
_spec = _util.spec_from_file_location("dsa_kernels.ab___NAME___rounds", _os.path.join(_os.path.dirname(__file__), "__NAME___rounds.py"))
rounds = _sys.modules[_spec.name] = _util.module_from_spec(_spec)
_spec.loader.exec_module(rounds)
''')
c = c.replace("from .topk_rounds import BINS", "BINS = rounds.BINS")
# streamed: gathered keys and last_taken
old_s = '''            _scatter(gather + entry, _ordered_key(x).to(tl.int32, bitcast=True), live)
            _scatter(gather + PAIR_CAP + entry, pos, live)'''
assert old_s in c
c = c.replace(old_s, '''            rounds.gather_keys(gather, entry, _ordered_key(x).to(tl.int32, bitcast=True), pos, live, PAIR_CAP, P)''')
c = c.replace("rounds.last_taken(gather, share, need, first, PAIR_CAP)", "rounds.last_taken(gather, share, need, first, PAIR_CAP, P)")
# the start said early, waited for before the first push
old_k = '''    row = tl.program_id(0)
    part = tl.program_id(1)
'''
c = c.replace(old_k, '''    if (P > 1) and (P <= rounds.MAX_CLUSTER):
        row = tl.program_id(0) // P
        part = tl.program_id(0) % P
    else:
        row = tl.program_id(0)
        part = tl.program_id(1)
''')
old_d = '''    elif CHUNKS > 1:
        _streamed('''

old_1 = '''    else:
        first = part * SLICE
        pos = first + tl.arange(0, SLICE)'''
assert old_1 in c
c = c.replace(old_1, '''    else:
        first = part * SLICE
        pos = first + tl.arange(0, SLICE)''')
old_e = '''        b, above, share, above_before, share_before = rounds.exchange(hist, exch, 0, counter, part, K, P)
        need = K - above'''
assert old_e in c
c = c.replace(old_e, '''        rounds.cluster_wait(P)
        b, above, share, above_before, share_before = rounds.exchange(hist, exch, 0, counter, part, K, P)
        need = K - above''')
old_st = '''    value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale = rounds.first_round(
        base, length, K, SAMPLE, 4.5)
'''
assert old_st in c
c = c.replace(old_st, old_st + "    rounds.cluster_wait(P)\n")
# launch: clusters of P programs
old_l = '''    try:
        _topk_kernel[(n, parts)]('''
assert old_l in c
c = c.replace(old_l, '''    if 1 < parts <= rounds.MAX_CLUSTER:
        _cluster_launch(n, parts, [
            logits, logits.stride(0), row_starts if row_starts is not None else lengths, lengths,
            counters,
            exch, gather, lists, flags, out, out.stride(0), bt,
            bt.stride(0) if block_table is not None else 0, offsets if offsets is not None else lengths, next_n],
            dict(K=k, P=parts, SLICE=slice_, CHUNKS=chunks, SAMPLE=SAMPLE, PAIR_CAP=PAIR_CAP,
                 HAS_STARTS=row_starts is not None, PAGE=page_size, TRANSFORM=transform), _warps(slice_))
        return True
    try:
        _topk_kernel[(n, parts)](''')
c = c.replace('''def _warps(slice_: int) -> int:''', '''def _cluster_launch(n, parts, args, constexprs, num_warps):
    """n clusters of `parts` programs (compiled for one CTA; Triton 3.6's launcher takes the
    cluster size from the packed metadata's second field and multiplies the grid by it)."""
    kernel = _topk_kernel.run(*args, grid=(n * parts,), warmup=True, num_warps=num_warps, **constexprs)
    kernel._init_handles()
    assert kernel.metadata.shared <= rounds.EXCH_AT, kernel.metadata.shared
    values = list(args) + [constexprs[name] for name in _topk_kernel.arg_names[len(args):]]
    warps, _, _ = kernel.packed_metadata
    kernel.run(n, 1, 1, torch.cuda.current_stream().cuda_stream, kernel.function,
               (warps, parts, rounds.SMEM_END), None, None, None, *values)


def _warps(slice_: int) -> int:''')
for name, dsmem in (("ck", True), ("cb", False)):
    open(f".ab/ck/{name}_rounds.py", "w").write(r.replace("__DSMEM__", str(dsmem)))
    open(f".ab/ck/{name}.py", "w").write(c.replace("__NAME__", name))
print("ok")
