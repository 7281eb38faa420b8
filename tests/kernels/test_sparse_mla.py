"""Sparse MLA matches the float32 reference over bf16 and FP8 pools, with split-K and -1 entries.

The kernel rounds FP8 rows to bf16 after applying their tile scales in float32 (FlashMLA rounds the
scale to bf16 first), so over an FP8 pool scores carry bf16 rounding of K and lse gets a looser
bound than over a bf16 pool.
"""

import itertools
import logging
import math

import pytest
import torch
import triton
from triton.compiler.errors import CompilationError

from dsa_kernels import batch_invariant, cache_store, dispatch, gluon_compat, grid_barrier, reference, sparse_mla
from dsa_kernels.device import num_sms


SLOTS, HEADS, TOPK, SCALE = 90, 32, 40, 576**-0.5
TILES = dict(BLOCK_H=16, BLOCK_N=16, num_warps=4, num_stages=1)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def _pool(fp8):
    pool = torch.zeros(SLOTS, 656, dtype=torch.uint8) if fp8 else torch.zeros(SLOTS, 576, dtype=torch.bfloat16)
    cache_store.store_mla(pool, torch.randn(SLOTS, 512), torch.randn(SLOTS, 64), torch.arange(SLOTS))
    return pool


def _indices(n):
    idx = torch.randint(0, SLOTS, (n, TOPK)).int()
    idx[0, 3:] = -1  # short row
    idx[1] = -1  # nothing to attend to: output 0, lse -inf
    idx[2, 7] = SLOTS + 3  # out of range counts as invalid
    return idx


def _check(fp8, config):
    q = (torch.randn(3, HEADS, 576) * 2).to(torch.bfloat16)
    pool, idx = _pool(fp8), _indices(3)
    out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=config)
    want, want_lse = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert out.dtype == torch.bfloat16 and out.shape == (3, HEADS, 512) and lse.shape == (3, HEADS)
    assert relative_error(out.float(), want) < (1e-2 if fp8 else 5e-3)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert (lse[finite] - want_lse[finite]).abs().max() < (3e-2 if fp8 else 1e-3)
    assert out[1].abs().max() == 0


# split 3 does not divide the 3 tiles of 16 keys evenly; split 8 leaves five splits with no keys;
# the merge takes whole rows, on two warps up to 16 splits and four at 32 (merge_warps)
@pytest.mark.parametrize("block_h,split", [(16, 1), (32, 1), (16, 2), (16, 3), (16, 8), (32, 8), (16, 32)])
@pytest.mark.parametrize("fp8", [False, True])
def test_sparse_mla_matches_reference(fp8, block_h, split):
    _check(fp8, dict(TILES, BLOCK_H=block_h, SPLIT=split))


@pytest.mark.parametrize("fp8", [False, True])
def test_default_config_matches_reference(fp8):
    _check(fp8, None)


def test_prefill_is_the_same_kernel_over_a_ragged_bf16_buffer():
    kv = torch.randn(50, 576).to(torch.bfloat16)
    q = torch.randn(4, HEADS, 576).to(torch.bfloat16)
    idx = torch.stack([torch.arange(TOPK) % (i + 1) for i in range(4)]).int()  # causal-like prefixes
    out, _ = sparse_mla.sparse_mla(q, kv, idx, SCALE, config=dict(TILES, SPLIT=1))
    want, _ = reference.sparse_mla_ref(q, kv, idx, SCALE)
    assert relative_error(out.float(), want) < 5e-3


@pytest.mark.parametrize("fp8", [False, True])
def test_gathered_rows_are_the_pools_rows_dequantized_to_bf16(fp8):
    pool = _pool(fp8)
    slots = torch.tensor([7, 0, SLOTS - 1, 7, 33, 2, 64, 65, 12, 40, 41, 42, 43, 44, 45, 46, 47, 1], dtype=torch.int32)
    got = sparse_mla.gather_kv_rows(pool, slots)  # 18 rows: a ragged second block of 16
    assert got.dtype == torch.bfloat16 and got.shape == (18, 576)
    assert torch.equal(got, reference.dequantize_mla_rows(pool, slots).bfloat16())
    assert torch.equal(dispatch.gather_kv_rows(pool, slots), got)  # the CPU path: the reference
    assert sparse_mla.gather_kv_rows(pool, slots[:0]).shape == (0, 576)


def test_small_decode_batches_split_topk_into_at_most_one_wave_of_64_key_splits():
    # the sweeps' best (128 heads, 132 SMs): split 32 at batch 1, 2 at batch 32; one-tile programs
    # on at most half the SMs: 16 at batch 2 (64 programs of two tiles, not 128 of one)
    for batch, split in ((1, 32), (2, 16), (3, 16), (4, 16), (8, 8), (12, 4), (32, 2)):
        cfg = sparse_mla.mla_config(batch, 128, 2048, num_sms=132)
        assert cfg["SPLIT"] == split and batch * 128 // cfg["BLOCK_H"] * split <= 132
        assert 2048 // split >= 64 == cfg["BLOCK_N"]


def test_grids_a_wave_would_leave_half_idle_split_into_two():
    # 128 heads on 132 SMs: 34 rows are 68 programs of 32 tiles (one wave, half the SMs idle), in 3
    # splits two waves of 11 tiles; from a wave of unsplit programs (66 rows) none
    for batch, split in ((17, 3), (34, 3), (44, 3), (48, 1), (66, 1), (67, 1), (80, 1), (128, 1), (140, 1)):
        assert sparse_mla.mla_config(batch, 128, 2048, num_sms=132)["SPLIT"] == split, batch
    assert sparse_mla.mla_config(40, 64, 2048, num_sms=132)["SPLIT"] == 3


def test_grids_whose_split_takes_a_second_wave_run_balanced():
    # 128 heads on 132 SMs: at 34-41 rows 3 splits would take two waves; an equal share of every
    # row's tiles a program models faster. One wave (33, 48, 66 rows) keeps the split grid
    balanced = [b for b in range(1, 67) if sparse_mla.mla_config(b, 128, 2048, num_sms=132)["BALANCED"]]
    assert balanced == [*range(34, 42)]
    assert [b for b in range(1, 133) if sparse_mla.mla_config(b, 64, 2048, num_sms=132)["BALANCED"]] == [*range(67, 84)]
    assert all(sparse_mla.mla_config(b, 128, 2048, num_sms=132)["WAVE_ROWS"] == 0 for b in range(1, 67))


def test_rows_past_whole_waves_run_balanced_where_they_would_fill_under_half_a_wave():
    # 128 heads on 132 SMs: a wave holds 66 unsplit rows. 67-99 rows: 66 in a wave, the rest (1-33)
    # balanced; 100-132 two waves unsplit; 133-165 two waves and a balanced rest. 64 heads: 132 a wave
    def grid(batch, heads):
        cfg = sparse_mla.mla_config(batch, heads, 2048, num_sms=132)
        return cfg["SPLIT"], cfg["BALANCED"], cfg["WAVE_ROWS"]

    for batch in range(67, 100):
        assert grid(batch, 128) == (1, True, 66), batch
    for batch in (*range(100, 133), 166, 198):
        assert grid(batch, 128) == (1, False, 0), batch
    assert grid(133, 128) == grid(165, 128) == (1, True, 132) and grid(200, 128) == (1, True, 198)
    assert grid(133, 64) == grid(198, 64) == (1, True, 132) and grid(199, 64) == grid(264, 64) == (1, False, 0)
    # short top-k ranges: a balanced grid is mostly its call
    assert not sparse_mla.mla_config(140, 128, 256, num_sms=132)["BALANCED"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(batch_invariant, "_ENABLED", True)
        assert not any(sparse_mla.mla_config(b, 128, 2048, num_sms=132)["BALANCED"] for b in (34, 70, 100, 140))


def test_one_tile_programs_fill_half_the_sms_at_most():
    # 64 heads: 32 programs of one tile at batch 1 and 64 at batch 2; at batch 3-4 a whole wave of
    # one-tile programs would cost more in partials than the tiles it shortens: 16 splits of two
    splits = [sparse_mla.mla_config(batch, 64, 2048, num_sms=132)["SPLIT"] for batch in range(1, 17)]
    assert splits == [32, 32, 16, 16, 16, 16, 16, 16, 8, 8, 8, 8, 8, 8, 8, 8]


def test_grids_that_cover_the_sms_are_not_split():
    for batch, heads in ((128, 128), (4096, 128), (4096, 64)):
        cfg = sparse_mla.mla_config(batch, heads, 2048, num_sms=132)
        assert cfg["SPLIT"] == 1 and heads % cfg["BLOCK_H"] == 0


def test_batch_invariant_mode_splits_topk_by_its_length_alone(monkeypatch):
    # the default split falls with the batch (32 for one row, 1 from 66), and a row merged from 32
    # splits rounds differently from one merged from 1: under the mode every batch gets the same
    monkeypatch.setattr(batch_invariant, "_ENABLED", True)
    for batch in (1, 4, 32, 128, 4096):
        assert sparse_mla.mla_config(batch, 128, 2048, num_sms=132)["SPLIT"] == 2048 // sparse_mla.INVARIANT_KEYS_PER_SPLIT
    assert sparse_mla.mla_config(1, 128, 64)["SPLIT"] == 1


def test_split_rows_go_in_slices_that_bound_their_partials_and_round_the_same(monkeypatch):
    q = (torch.randn(3, HEADS, 576) * 2).to(torch.bfloat16)
    pool, idx = _pool(True), _indices(3)
    whole = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(TILES, SPLIT=2))
    monkeypatch.setattr(sparse_mla, "PARTIAL_BYTES", 2 * HEADS * 512 * 4)  # one row's partials
    sliced = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(TILES, SPLIT=2))
    assert torch.equal(sliced[0], whole[0]) and torch.equal(sliced[1], whole[1])


def test_merge_programs_hold_at_most_128_values_a_thread():
    for split in (2, 3, 4, 8, 16, 32, 64):
        warps = sparse_mla.merge_warps(split)
        assert 2 <= warps <= 8 and triton.next_power_of_2(split) * 512 <= 128 * 32 * warps
    assert sparse_mla.merge_warps(4) == 2 and sparse_mla.merge_warps(32) == 4


def _balanced_runs(units, tiles, programs):
    """kernels/sparse_mla_gluon_schedule.balanced_share / balanced_run in Python: each program's runs
    (unit, first tile, end)."""
    total = units * tiles
    for c in range(programs):
        g, last, runs = c * total // programs, (c + 1) * total // programs, []
        while g < last:
            u = g // tiles
            end = min(last - u * tiles, tiles)
            runs.append((u, g - u * tiles, end))
            g = u * tiles + end
        yield c, runs


# (units x tiles over programs: the units split) 3 x 4 over 5: every unit; 4 x 3 over 12, a tile a
# program: every unit, in three pieces; 4 x 2 over 3: unit 2 alone; 1 x 1 over 1: none. Two CTAs a
# program (CTA pairs, a unit 128 heads): 3 x 4 over 5 again, and 2 x 3 over 6, a tile a program
@pytest.mark.parametrize("heads,batch,topk,programs,ctas,split",
                         [(64, 3, 200, 5, 1, {0, 1, 2}), (128, 2, 130, 12, 1, {0, 1, 2, 3}), (64, 4, 128, 3, 1, {2}),
                          (64, 1, 64, 1, 1, set()), (128, 3, 200, 5, 2, {0, 1, 2}), (128, 2, 130, 6, 2, {0, 1})],
                         ids=["runs-cross-units", "a-unit-over-many-programs", "whole-and-split", "one-whole-unit",
                              "pairs", "pairs-a-tile-a-program"])
def test_the_balanced_merge_joins_each_split_unit_from_its_programs_partial_rows(heads, batch, topk, programs, ctas,
                                                                                split):
    """Partial rows laid out as the balanced grid writes them (a CTA's first run in row (c, 0), its
    last in (c, 1), a unit it finishes straight to the output), from the reference's attention
    over each run's top-k range: the merge kernel fills exactly the split units, as the whole range would."""
    q = (torch.randn(batch, heads, 576) * 2).to(torch.bfloat16)
    pool, idx = _pool(True), torch.randint(0, SLOTS, (batch, topk)).int()
    idx[0, 5:] = -1  # a short row: some runs see nothing
    want, want_lse = reference.sparse_mla_ref(q, pool, idx, SCALE)
    want, want_lse = want.to(torch.bfloat16).view(-1, 512), want_lse.view(-1)
    units, tiles = batch * heads // (64 * ctas), triton.cdiv(topk, 64)
    part = torch.full((programs * ctas * 2 * 64, 512), float("nan"))
    part_lse = torch.full((programs * ctas * 2 * 64,), float("nan"))
    out, lse = torch.full_like(want, float("nan")), torch.full_like(want_lse, float("nan"))
    split_units = set()
    for c, runs in _balanced_runs(units, tiles, programs):
        for rank, (r, (u, t0, t1)) in itertools.product(range(ctas), enumerate(runs)):
            # head block by head block (sparse_mla_gluon_schedule.balanced_unit)
            n, h0 = u % batch, (u // batch * ctas + rank) * 64
            heads_of_u = slice(h0, h0 + 64)
            o, o_lse = reference.sparse_mla_ref(q[n:n + 1, heads_of_u], pool, idx[n:n + 1, t0 * 64:t1 * 64], SCALE)
            if t0 == 0 and t1 == tiles:  # written by the kernel itself
                rows = slice(n * heads + h0, n * heads + h0 + 64)
                out[rows], lse[rows] = o[0].to(torch.bfloat16), o_lse[0]
            else:
                split_units.add(u)
                first = ((c * ctas + rank) * 2 + min(r, 1)) * 64
                part[first:first + 64], part_lse[first:first + 64] = o[0], o_lse[0] / math.log(2)
    pieces = sparse_mla.balanced_pieces(units, tiles, programs)
    sparse_mla._merge_balanced_kernel[(programs * ctas, 64)](part, part_lse, out, lse, tiles, units * tiles, H=heads,
                                                             PIECES=triton.next_power_of_2(pieces), CTAS=ctas)
    assert split_units == split
    torch.testing.assert_close(out.float(), want.float(), rtol=2**-7, atol=1e-6)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    torch.testing.assert_close(lse[torch.isfinite(lse)], want_lse[torch.isfinite(want_lse)], rtol=1e-5, atol=1e-5)


def test_split_below_one_is_refused():
    q = torch.zeros(1, HEADS, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="SPLIT"):
        sparse_mla.sparse_mla(q, _pool(False), _indices(3)[:1], SCALE, config=dict(TILES, SPLIT=0))


def test_the_gluon_kernel_is_chosen_for_hopper_grids_only():
    q, pool = torch.zeros(64, 128, 576, dtype=torch.bfloat16), _pool(True)
    assert not sparse_mla.gluon_runs(q, pool)  # CPU: the Triton kernel (here under the interpreter)
    misaligned = torch.zeros(SLOTS, 584, dtype=torch.bfloat16)[:, :576]  # rows 584 elements apart
    assert misaligned.stride(0) % 16 and not sparse_mla.gluon_runs(q, misaligned)


def test_a_gluon_kernel_that_does_not_compile_leaves_the_triton_kernel_serving(monkeypatch, caplog):
    # as on Hopper with a Triton whose Gluon API the kernel does not match
    monkeypatch.setattr(gluon_compat, "_BROKEN", set())
    monkeypatch.setattr(sparse_mla.sparse_mla_gluon, "runs_on", lambda device: True)

    def does_not_compile(*args, **kwargs):
        raise CompilationError(None, None, "AttributeError: a Gluon name this Triton renamed")

    monkeypatch.setattr(sparse_mla.sparse_mla_gluon, "launch", does_not_compile)
    q = (torch.randn(3, 64, 576) * 2).to(torch.bfloat16)
    pool, idx = _pool(True), _indices(3)
    assert sparse_mla.gluon_runs(q, pool)
    with caplog.at_level(logging.WARNING):
        out, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    assert "does not compile" in caplog.text
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert relative_error(out.float(), want) < 1e-2
    assert not sparse_mla.gluon_runs(q, pool)  # not tried again in this process
    with pytest.raises(CompilationError):  # asked for by name, it is not replaced
        sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(SPLIT=1), gluon=True)


hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="the Gluon kernel is sm_90 only")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("heads,topk,split", [(64, 100, 1), (128, 100, 3), (128, 40, 8), (64, 2048, 4), (128, 64, 1)],
                         ids=["partial-tile", "uneven-splits", "empty-splits", "full-topk", "one-tile"])
@pytest.mark.parametrize("fp8", [False, True])
def test_gluon_kernel_matches_the_reference_on_hopper(fp8, heads, topk, split):
    slots = 300
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"),
                          torch.arange(slots, device="cuda"))
    q = (torch.randn(5, heads, 576, device="cuda") * 2).to(torch.bfloat16)
    idx = torch.randint(0, slots, (5, topk), device="cuda").int()
    idx[0, 3:] = -1  # short row
    idx[1] = -1  # nothing to attend to: output 0, lse -inf
    idx[2, 7] = slots + 3  # out of range counts as invalid
    out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(SPLIT=split), gluon=True)
    want, want_lse = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert relative_error(out.float(), want) < (1e-2 if fp8 else 5e-3)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert (lse[finite] - want_lse[finite]).abs().max() < (3e-2 if fp8 else 1e-3)
    assert out[1].abs().max() == 0
    # the default path takes it here, and it agrees with the Triton kernel more closely than either with the reference
    assert sparse_mla.gluon_runs(q, pool)
    tri, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(sparse_mla.mla_config(5, heads, topk), SPLIT=split),
                                   gluon=False)
    assert relative_error(out.float(), tri.float()) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
def test_batch_invariant_mode_gives_a_row_the_same_bits_in_any_batch(monkeypatch, fp8):
    """DeepSeek-V3.2's 128 heads and top-k 2048, through the dispatch as the engine calls it: without
    the mode a row alone (split 32, or FlashMLA's schedule) and among 32 (split 2) differ in the
    last bits (docs/PERFORMANCE.md, "Sparse MLA under batch-invariant mode")."""
    monkeypatch.setattr(batch_invariant, "_ENABLED", True)
    slots = 1 << 16
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"),
                          torch.arange(slots, device="cuda"))
    q = (torch.randn(600, 128, 576, device="cuda") * 0.5).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(slots, device="cuda")[:2048] for _ in range(600)]).int()
    idx[3, 1000:] = -1  # a short row
    whole = dispatch.sparse_mla_decode(q[:32], pool, idx[:32], SCALE)[0]
    for n in (1, 5, 600):  # 600 rows: a prefill chunk's, in slices of 256 (PARTIAL_BYTES)
        assert torch.equal(dispatch.sparse_mla_decode(q[:n], pool, idx[:n], SCALE)[0][:32], whole[:n])
    if not fp8:  # a decode token in a mixed batch takes the prefill entry (KernelDsaBackend.sparse_mla)
        assert torch.equal(dispatch.sparse_mla_prefill(q[:5], pool, idx[:5], SCALE)[0], whole[:5])


def _decode_case(batch, heads, fp8, slots=1 << 14, topk=2048):
    g = torch.Generator(device="cuda").manual_seed(batch * heads + fp8)
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda", generator=g),
                          torch.randn(slots, 64, device="cuda", generator=g), torch.arange(slots, device="cuda"))
    q = (torch.randn(batch, heads, 576, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    idx = torch.randint(0, slots, (batch, topk), device="cuda", generator=g).int()
    idx[0, 700:] = -1  # a short row: some splits see nothing
    if batch > 1:
        idx[1] = -1  # nothing at all: output 0, lse -inf
    return q, pool, idx


def _within_an_ulp(out, other):
    torch.testing.assert_close(out.float(), other.float(), rtol=2**-7, atol=1e-6)


class _Counted:
    """A kernel whose launches are counted."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def _no_merge_launch(*args, **kwargs):
    raise AssertionError("the merge kernel ran where the splits should have merged in the Gluon kernel")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("heads,batch", [(128, 32), (128, 25), (128, 16), (64, 64), (64, 32)])
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
def test_splits_that_meet_in_the_kernel_merge_as_the_merge_kernel_does(monkeypatch, fp8, heads, batch):
    """Splits 2 and 4 (mla_config's at these batches), merged where they meet (a cooperative launch)
    and by the merge kernel: equal to within an ulp of bf16 and of the lse, and the merge kernel
    does not run for the first."""
    q, pool, idx = _decode_case(batch, heads, fp8)
    assert sparse_mla.mla_config(batch, heads, idx.shape[1])["SPLIT"] in sparse_mla.sparse_mla_gluon.MERGES
    with monkeypatch.context() as m:
        m.setattr(sparse_mla.sparse_mla_gluon, "MERGES", ())
        apart, apart_lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    with monkeypatch.context() as m:
        m.setattr(sparse_mla, "_merge_splits_kernel", _no_merge_launch)
        met, met_lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    _within_an_ulp(met, apart)
    assert torch.equal(torch.isinf(met_lse), torch.isinf(apart_lse))
    torch.testing.assert_close(met_lse, apart_lse, rtol=1e-6, atol=1e-6)
    assert met[1].abs().max() == 0 and torch.isinf(met_lse[1]).all()
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert relative_error(met.float(), want) < (1e-2 if fp8 else 5e-3)


@pytest.mark.gpu
@hopper
def test_eight_splits_and_more_take_the_merge_kernel(monkeypatch):
    merge_kernel = _Counted(sparse_mla._merge_splits_kernel)
    monkeypatch.setattr(sparse_mla, "_merge_splits_kernel", merge_kernel)
    for batch in (1, 2, 8):  # splits 32, 16, 8 at 128 heads
        q, pool, idx = _decode_case(batch, 128, True)
        out, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE)
        want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
        assert relative_error(out.float(), want) < 1e-2
    assert len(merge_kernel.grids) == 3


@pytest.mark.gpu
@hopper
def test_splits_meet_in_cuda_graph_replays_after_an_eager_call_and_not_before(monkeypatch, caplog):
    """As the one-launch top-k's meetings: a capture on a stream without meeting counters takes the
    merge kernel, with a warning; after an eager call there, captured graphs meet and replay in any
    order, over fresh queries each time."""
    q, pool, idx = _decode_case(32, 128, True)
    stream = torch.cuda.Stream()
    key = (q.device, stream.cuda_stream)
    grid_barrier._counters.pop(key, None)  # the stream pool recycles handles: start this stream bare
    grid_barrier._warn_capture_once.cache_clear()

    def captured():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = sparse_mla.sparse_mla(q, pool, idx, SCALE)[0]
        return graph, out

    with caplog.at_level("WARNING", logger=grid_barrier.__name__):
        cold = captured()
    assert key not in grid_barrier._counters and "merge kernel" in caplog.text
    with torch.cuda.stream(stream):
        sparse_mla.sparse_mla(q, pool, idx, SCALE)
    stream.synchronize()
    assert key in grid_barrier._counters
    with monkeypatch.context() as m:
        m.setattr(sparse_mla, "_merge_splits_kernel", _no_merge_launch)
        first, second = captured(), captured()
    g = torch.Generator(device="cuda").manual_seed(5)
    for graph, out in (second, first, cold, first, second):
        q.copy_((torch.randn(q.shape, device="cuda", generator=g) * 0.5).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        eager = sparse_mla.sparse_mla(q, pool, idx, SCALE)[0]  # met
        if graph is cold:
            _within_an_ulp(out, eager)
        else:
            assert torch.equal(out, eager)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("batch", [5, 16, 64, 130])  # splits 8 (merge kernel), 4 (meeting), 1, 1 (two waves)
def test_fp8_cta_pairs_give_the_one_cta_kernels_bits(monkeypatch, batch):
    """At 128 heads over an FP8 pool an unsplit row's two head blocks run as a CTA pair, each
    dequantizing half of every tile for both: the same arithmetic, so the same bits, eager and in a
    CUDA graph. Split rows run one CTA a head block."""
    q, pool, idx = _decode_case(batch, 128, True)
    idx[-1, 1:] = -1  # a row of one key
    pairs = []
    real_launch = sparse_mla.sparse_mla_gluon.cta_pair.launch
    monkeypatch.setattr(sparse_mla.sparse_mla_gluon.cta_pair, "launch",
                        lambda *args, **kw: pairs.append(args[1]) or real_launch(*args, **kw))
    out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    split = sparse_mla.mla_config(batch, 128, 2048)["SPLIT"]
    assert sparse_mla.sparse_mla_gluon.PAIRS and len(pairs) == (split == 1)
    with monkeypatch.context() as m:
        m.setattr(sparse_mla.sparse_mla_gluon, "PAIRS", False)
        one, one_lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    assert torch.equal(out, one) and torch.equal(lse, one_lse)
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert relative_error(out.float(), want) < 1e-2
    if split in sparse_mla.sparse_mla_gluon.MERGES:  # (a capture's meetings: test_splits_meet_in_cuda_graph_...)
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = sparse_mla.sparse_mla(q, pool, idx, SCALE)[0]
    q.copy_((q.float() * -0.5).to(torch.bfloat16))  # fresh queries for the replay
    graph.replay()
    torch.cuda.synchronize()
    with monkeypatch.context() as m:
        m.setattr(sparse_mla.sparse_mla_gluon, "PAIRS", False)
        assert torch.equal(replayed, sparse_mla.sparse_mla(q, pool, idx, SCALE)[0])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("heads,batch,topk,wave_rows,pairs",
                         [(128, 70, 2048, 0, True), (128, 4, 2048, 0, True), (64, 67, 2000, 0, True),
                          (64, 5, 100, 0, True), (128, 1, 64, 0, True), (128, 70, 2048, 66, True),
                          (64, 140, 2048, 132, True), (128, 70, 2048, 0, False)],
                         ids=["runs-cross-units", "many-pieces", "partial-last-tile", "fewer-tiles-than-sms",
                              "one-tile", "a-wave-first", "a-wave-first-64-heads", "no-pairs"])
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
def test_a_balanced_grid_gives_the_unsplit_grids_output(fp8, heads, batch, topk, wave_rows, pairs, monkeypatch):
    """Every SM's program an equal share of all rows' tiles (after WAVE_ROWS rows on the unsplit grid;
    at 128 heads over FP8 both grids in CTA pairs), its runs crossing units and a unit merged from
    several programs' partials: a unit one program finishes is the unsplit grid's bit for bit (the
    same tiles in the same order), a merged one as close to the reference as the unsplit grid, eager
    and in a CUDA graph."""
    monkeypatch.setattr(sparse_mla.sparse_mla_gluon, "PAIRS", pairs)  # restored after the test
    q, pool, idx = _decode_case(batch, heads, fp8, topk=topk)
    config = dict(sparse_mla.mla_config(batch, heads, topk), SPLIT=1, WAVE_ROWS=wave_rows)
    whole, whole_lse = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=False), gluon=True)
    out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=True), gluon=True)
    assert torch.equal(out[:wave_rows], whole[:wave_rows]) and torch.equal(lse[:wave_rows], whole_lse[:wave_rows])
    rows, block = batch - wave_rows, 64 * (1 + sparse_mla.sparse_mla_gluon.balanced_pairs(heads, fp8))  # a unit's heads
    units, tiles = rows * heads // block, triton.cdiv(topk, 64)
    programs = min(num_sms(q.device) // (block // 64), units * tiles)
    finished = [u for _, runs in _balanced_runs(units, tiles, programs) for u, t0, t1 in runs if (t0, t1) == (0, tiles)]
    for u in finished:
        n, h = wave_rows + u % rows, slice(u // rows * block, u // rows * block + block)
        assert torch.equal(out[n, h], whole[n, h]) and torch.equal(lse[n, h], whole_lse[n, h]), u
    assert torch.equal(torch.isinf(lse), torch.isinf(whole_lse))
    torch.testing.assert_close(lse, whole_lse, rtol=1e-5, atol=1e-5)
    if batch > 1:
        assert out[1].abs().max() == 0 and torch.isinf(lse[1]).all()
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    bound = 1e-2 if fp8 else 5e-3
    assert relative_error(out.float(), want) < bound and relative_error(out.float(), whole.float()) < bound
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=True), gluon=True)[0]
    q.copy_((q.float() * -0.5).to(torch.bfloat16))  # fresh queries for the replay
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=True),
                                                       gluon=True)[0])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("batch", [64, 34], ids=["split-grid", "balanced-grid"])
def test_a_triton_the_pair_launch_does_not_know_runs_one_cta_with_a_warning(batch, monkeypatch, caplog):
    q, pool, idx = _decode_case(batch, 128, True)
    monkeypatch.setattr(sparse_mla.sparse_mla_gluon, "PAIRS", True)  # restored after the test

    def unknown_launcher(*args, **kwargs):
        raise sparse_mla.sparse_mla_gluon.cta_pair.Unavailable("this Triton's launcher: no such argument")

    monkeypatch.setattr(sparse_mla.sparse_mla_gluon.cta_pair, "launch", unknown_launcher)
    with caplog.at_level("WARNING", logger=sparse_mla.sparse_mla_gluon.__name__):
        out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
    assert "one CTA a head block" in caplog.text and not sparse_mla.sparse_mla_gluon.PAIRS
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    assert relative_error(out.float(), want) < 1e-2
