"""A request's state (dsa_backend/sequence.py)."""

from dsa_backend.sampling_params import SamplingParams
from dsa_backend.sequence import Sequence


def test_token_ids_slice_prompt_then_output_over_every_range():
    seq = Sequence("r", list(range(10)), SamplingParams(), 0, output_ids=list(range(100, 105)))
    every = seq.prompt_ids + seq.output_ids
    for start in range(16):
        for end in range(start, 17):
            assert seq.token_ids(start, end) == every[start:end]


def test_the_output_so_far_reads_like_the_copied_output_over_every_range():
    # read-back output, unread tokens (-1 - row), then a draft node's path: every slice as a list
    seq = Sequence("r", list(range(10)), SamplingParams(), 0, output_ids=list(range(100, 104)), pending_rows=[7, 8])
    view, copied = seq.output_so_far((500, 501)), [100, 101, 102, 103, -8, -9, 500, 501]
    assert len(view) == len(copied)
    for start in range(-3, 10):
        for stop in range(-3, 11):
            assert view[start:stop] == copied[start:stop]
    assert seq.output_so_far()[:] == copied[:6] and len(Sequence("e", [1], SamplingParams(), 0).output_so_far()) == 0
