"""replica_routing=least_busy in a real tritonserver with two replicas (on the CPU; on a machine of
two GPUs, one a GPU): a conversation's next turn goes to the less busy replica, where nothing of it
is cached, where the default (prefix) sends it to its earlier turn's replica
(test_server_data_parallel.py)."""

from __future__ import annotations

from .test_server_data_parallel import next_turn_beside_a_long_stream, pytestmark  # noqa: F401  (skip rule)

SERVER_SETTINGS = {"data_parallel_size": "2", "dtype": "float32", "replica_routing": "least_busy"}


def test_a_conversations_next_turn_goes_to_the_less_busy_replica(served):
    first, second, busy = next_turn_beside_a_long_stream(served)
    assert busy == 0 and first.num_input_tokens >= 64
    assert second.num_cached_tokens == 0        # computed again on replica 1
