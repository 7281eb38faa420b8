"""dsa_llm with tensor_parallel_size 2 in a real tritonserver: the engine runs as two processes
(rank 0 and its follower), and concurrent streams get the text of the offline LLM on one rank."""

from __future__ import annotations

import pytest
import torch

from dsa_backend.parallel import shares_one_gpu

from .servers import assert_concurrent_streams_match
from .test_server_engine_restart import engine_processes

pytestmark = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2 and not shares_one_gpu(),
                                reason="two ranks on a GPU machine take two GPUs (or DSA_TP_SHARE_ONE_GPU=1)")

# float32: the two ranks' sum rounds as one rank's does (in bf16 a greedy text may part at a near-tie)
SERVER_SETTINGS = {"tensor_parallel_size": "2", "dtype": "float32"}
PROMPTS = ["Tensor parallel ranks share every layer", "Each rank holds half of the heads", "短的"]


def test_two_ranks_serve_concurrent_streams_with_the_offline_llms_text(served, offline_llm):
    assert len(engine_processes(served)) == 2      # rank 0 under the stub, its follower under it
    assert_concurrent_streams_match(served, offline_llm, PROMPTS)
