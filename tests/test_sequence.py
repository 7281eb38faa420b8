"""A request's state (dsa_backend/sequence.py)."""

from dsa_backend.sampling_params import SamplingParams
from dsa_backend.sequence import Sequence


def test_token_ids_slice_prompt_then_output_over_every_range():
    seq = Sequence("r", list(range(10)), SamplingParams(), 0, output_ids=list(range(100, 105)))
    every = seq.prompt_ids + seq.output_ids
    for start in range(16):
        for end in range(start, 17):
            assert seq.token_ids(start, end) == every[start:end]
