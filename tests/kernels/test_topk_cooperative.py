"""The single-launch top-k equals the reference bit for bit. On the CPU its rows run as one program
(the interpreter runs programs one after another, so a row's programs could not meet), both held
in registers at once and streamed a slice at a time (a small max_slice streams small rows); the GPU
tests split rows across many programs that meet at barriers."""

import pytest
import torch

from dsa_kernels import grid_barrier, reference, topk
from dsa_kernels import topk_cooperative as tc


STREAMED = 256  # max_slice that streams every row of these tests over several slices


def _coop(logits, lengths, k, parts=1, max_slice=tc.MAX_SLICE, **transform):
    out = torch.full((logits.shape[0], k), -7, dtype=torch.int32, device=logits.device)
    assert tc.cooperative_topk(logits, lengths, transform.pop("row_starts", None), k, parts, out,
                               transform.pop("kind", topk.TRANSFORM_NONE), transform.pop("block_table", None),
                               transform.pop("page_size", 1), 1, transform.pop("offsets", None), max_slice)
    return out


def _check(logits, lengths, k, starts=None):
    lens = torch.tensor(lengths, dtype=torch.int32, device=logits.device)
    want = reference.topk_positions_ref(logits, lens, k, starts)
    for max_slice in (tc.MAX_SLICE, STREAMED):
        assert torch.equal(_coop(logits, lens, k, row_starts=starts, max_slice=max_slice), want), max_slice


@pytest.mark.parametrize("lengths", [[0, 1, 16, 17, 35, 700], [15, 57, 64, 699, 3, 700]])
def test_positions_match_reference_at_ragged_edges(lengths):
    _check(torch.randn(len(lengths), 700), lengths, 16)


@pytest.mark.parametrize("k", [16, 300, 1000])
def test_rounds_by_value_then_pairwise_rank_find_the_kth_key(k):
    # 3000-key normal rows: the sample's bracket around the k-th key, split 62 ways, leaves a few
    # dozen keys in its bin (k 16 and 1000 take the bracket's whole tail or most of the row)
    _check(torch.randn(3, 3000), [3000, 2500, 1200], k)


@pytest.mark.parametrize("side", ["below", "above"])
def test_a_kth_key_outside_the_samples_bracket_is_found_in_the_next_rounds(side):
    # The sampled keys are uniform on [0, 1), the others on [0, 0.5) (or [0.5, 1)): the sample puts
    # the k-th key near 0.75 while it lies near 0.4 (0.87), below (above) the bracket, so the first
    # round's edge bin holds it and the next rounds split the sample's span beyond the bracket.
    n, k = 6000, 600
    sampled = (torch.arange(tc.SAMPLE) * n) // tc.SAMPLE
    logits = torch.rand(2, n) * 0.5 + (0.5 if side == "above" else 0.0)
    logits[:, sampled] = torch.rand(2, tc.SAMPLE)
    logits[1] = logits[1].to(torch.bfloat16).float()  # and ties at the k-th key
    _check(logits, [n, n], k)


def test_a_program_whose_keys_above_the_bracket_overflow_its_list_goes_on_over_its_slice():
    # The sample is uniform on [0, 1) and puts the bracket near 0.9; every other key lies in
    # [0.85, 1), so most of the row sits at or above the bracket's low end: more than a quarter of
    # the slice, the list's size. The row before it lists a tenth of its keys, the one after skips
    # the list (shorter than 8 k).
    n, k = 6000, 600
    sampled = (torch.arange(tc.SAMPLE) * n) // tc.SAMPLE
    logits = torch.randn(3, n)
    logits[1] = torch.rand(n) * 0.15 + 0.85
    logits[1, sampled] = torch.rand(tc.SAMPLE)
    _check(logits, [n, n, 4000], k)


def test_rows_without_a_value_span_go_by_key_bits_then_positions():
    # a sample holding infinities, a constant row and 16 values: the value rounds are skipped or
    # cannot split the ties, so key-bit digits and then position digits pick the lowest positions
    logits = torch.randn(4, 900)
    logits[0, ::4] = float("inf")
    logits[0, 1::4] = float("-inf")
    logits[1] = 2.5
    logits[2] = torch.randint(0, 16, (900,)).float()
    logits[3, ::2] = -0.0
    logits[3, 1::2] = 0.0
    _check(logits, [900, 900, 871, 900], 100)


def test_a_bin_holding_exactly_the_keys_still_needed_is_taken_whole():
    logits = torch.zeros(2, 500)
    logits[0, 100:116] = 1000.0 + torch.arange(16.0)  # the top value bin holds the 16 keys needed
    logits[1, 7::31] = 5.0  # 17 equal keys: one more than needed, ties to the lowest positions
    _check(logits, [500, 500], 16)


def test_extreme_floats_rank_in_float_order():
    logits = torch.randn(2, 400)
    logits[0, 3], logits[0, 5], logits[0, 8] = 3e38, -3e38, 1e-38
    logits[1, ::3] = -3e38
    logits[1, 1::5] = 1e-38
    _check(logits, [400, 397], 16)


@pytest.mark.parametrize("max_slice", [tc.MAX_SLICE, STREAMED])
def test_row_starts_and_both_transforms(max_slice):
    logits = torch.randn(3, 600)
    lens = torch.tensor([400, 90, 17], dtype=torch.int32)
    starts = torch.tensor([0, 300, 583], dtype=torch.int32)
    pos = reference.topk_positions_ref(logits, lens, 16, starts)
    table = torch.randperm(3 * 600 // 8).view(3, -1).int()
    got = _coop(logits, lens, 16, row_starts=starts, kind=topk.TRANSFORM_PAGED, block_table=table, page_size=8,
                max_slice=max_slice)
    assert torch.equal(got, reference.paged_transform_ref(pos, table, 8))
    offsets = torch.tensor([5, 1000, 77], dtype=torch.int32)
    got = _coop(logits, lens, 16, row_starts=starts, kind=topk.TRANSFORM_RAGGED, offsets=offsets, max_slice=max_slice)
    assert torch.equal(got, torch.where(pos >= 0, pos + offsets[:, None], -1))


@pytest.mark.parametrize("k", [40, 1000])
def test_streamed_spans_list_or_go_on_over_their_slices(k):
    # 4096-key rows read 256 keys at a time: at k 40 the keys at or above the bracket fit the list
    # (a slice's worth), at k 1000 they overflow it and the rounds read the span again; the ragged
    # lengths end mid-slice, and one row is no longer than k
    logits = torch.randn(4, 4096)
    logits[2] = torch.randint(0, 16, (4096,)).float()
    lens = [4096, 3001, 4090, 900]
    _check(logits, lens, k)


def test_default_dispatch_takes_one_launch_under_the_interpreter():
    assert tc.parts_per_row(8, tc.MAX_SPAN, 132) == 1
    assert tc.parts_per_row(8, tc.MAX_SPAN + 1, 132) is None
    logits = torch.randn(2, 3000)
    lens = torch.tensor([3000, 40], dtype=torch.int32)
    assert torch.equal(topk.topk_transform(logits, lens, 64), reference.topk_positions_ref(logits, lens, 64))


@pytest.mark.parametrize("rows, width, parts", [(1, 32768, 64), (4, 32768, 32), (8, 32768, 16), (32, 32768, 4),
                                                (33, 32768, 4), (1, 131072, 128), (8, 131072, 16), (1, 4096, 8),
                                                (34, 32768, 2), (64, 32768, 2), (32, 131072, 4), (128, 32768, 1),
                                                (16, 131072, 8), (128, 65536, None), (133, 4096, 1),
                                                (1000, 32768, 1), (1000, 32769, None)])
def test_device_parts_fill_the_sms_with_parts_of_512_keys_to_spans_of_four_slices(rows, width, parts):
    """Rows of one program (up to four slices) are served at any batch: they wait for no other."""
    assert tc.device_parts(rows, width, 132) == parts


def test_device_parts_stop_at_128_where_a_meeting_counts_to_128():
    assert tc.device_parts(1, 1 << 20, 300) == tc.MAX_PARTS == 128


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width", [(1, 32768), (4, 20000), (32, 32768), (8, 131072), (64, 32768), (128, 32768),
                                         (32, 131072), (200, 32768), (300, 4096)])
def test_rows_split_across_programs_match_the_reference_on_cuda(rows, width):
    k, page = 2048, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(rows, width, device="cuda", generator=g)
    logits[0] = logits[0].to(torch.bfloat16).float()  # ties
    if rows > 2:
        logits[1] = torch.randint(0, 16, (width,), device="cuda", generator=g).float()  # massive ties
        logits[2, ::5] = float("-inf")
    if rows > 3:  # the top keys all in the last programs: those keep their slices, the others list
        logits[3] = logits[3].sort().values
    lens = torch.randint(k - 5, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    lens[-1] = min(width, k)
    table = torch.randperm(rows * -(-width // page), device="cuda", generator=g).view(rows, -1).int()
    parts = tc.parts_per_row(rows, width, torch.cuda.get_device_properties(0).multi_processor_count)
    assert parts is not None
    want = reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, k), table, page)
    for _ in range(5):  # the barrier counters carry over from launch to launch
        got = _coop(logits, lens, k, parts, kind=topk.TRANSFORM_PAGED, block_table=table, page_size=page)
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_a_grid_too_large_to_be_resident_is_refused_and_the_three_launches_serve():
    rows = 64 * torch.cuda.get_device_properties(0).multi_processor_count  # 2 programs a row: never all resident
    logits = torch.randn(rows, 1024, device="cuda")
    lens = torch.full((rows,), 1024, device="cuda", dtype=torch.int32)
    out = torch.full((rows, 512), -7, device="cuda", dtype=torch.int32)
    assert not tc.cooperative_topk(logits, lens, None, 512, 2, out, topk.TRANSFORM_NONE, None, 1, 1, None)
    assert (out == -7).all()
    assert torch.equal(topk.topk_transform(logits, lens, 512), reference.topk_positions_ref(logits, lens, 512))


def test_a_capture_never_makes_the_barrier_counters(monkeypatch, caplog):
    """The rule alone (the GPU test below runs it in real captures): a capture on a stream without
    counters gets none (the caller then takes the three launches), with a warning, and makes none."""
    device = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": -12345})())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    grid_barrier._warn_capture_once.cache_clear()
    with caplog.at_level("WARNING", logger=grid_barrier.__name__):
        assert grid_barrier.counters(device, 4, "the top-k", "the three launches") is None
    assert "three launches" in caplog.text and (device, -12345) not in grid_barrier._counters


@pytest.mark.gpu
def test_graphs_take_the_single_launch_only_where_an_eager_call_made_the_counters(caplog):
    """A capture that finds no barrier counters on its stream takes the three launches (counters
    made inside it would be zeroed only by that graph's replays); after one eager call there, later
    captures share the counters and replay in any order."""
    rows, width, k = 32, 32768, 2048
    assert tc.parts_per_row(rows, width, torch.cuda.get_device_properties(0).multi_processor_count) > 1
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(rows, width, device="cuda", generator=g)
    lens = torch.full((rows,), width, device="cuda", dtype=torch.int32)
    stream = torch.cuda.Stream()
    key = (logits.device, stream.cuda_stream)
    grid_barrier._counters.pop(key, None)  # the stream pool recycles handles: start this stream bare
    grid_barrier._warn_capture_once.cache_clear()  # the warning comes once a process

    def captured():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = topk.topk_transform(logits, lens, k)
        return graph, out

    with caplog.at_level("WARNING", logger=grid_barrier.__name__):
        cold = captured()
    assert key not in grid_barrier._counters and "three launches" in caplog.text
    with torch.cuda.stream(stream):
        topk.topk_transform(logits, lens, k)
    stream.synchronize()
    assert key in grid_barrier._counters
    first, second = captured(), captured()
    for graph, out in (second, first, cold, first, second):
        logits.copy_(torch.randn(rows, width, device="cuda", generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, reference.topk_positions_ref(logits, lens, k))
