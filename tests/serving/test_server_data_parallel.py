"""dsa_llm with data_parallel_size 2 in a real tritonserver: two engines (replicas), each in a
process of its own, behind one model instance (dsa_backend/replicas.py). On the CPU both run there;
on a machine of two GPUs, one a GPU. Requests spread over them, each replica reports its own
gauges, a client's cancellation through the ensemble reaches the replica running the request, and
a conversation's later turns go where its earlier ones are cached (PrefixRouter), and while one
replica's engine restarts the other takes every request."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
import torch

from dsa_client.grpc_stream import generate
from dsa_client.loadgen import run_concurrency, sweep
from dsa_client.workload import make_requests

from .servers import assert_concurrent_streams_match, read_metric
from .test_server_e2e import settle
from .test_server_engine_restart import engine_processes

pytestmark = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                                reason="two replicas on a GPU machine take two GPUs")

# float32 on a GPU: the offline reference runs in other batches than the replicas' (in bf16 a
# greedy text may part at a near-tie); on the CPU float32 is the default
SERVER_SETTINGS = {"data_parallel_size": "2", "dtype": "float32"}
PROMPTS = ["Replicas share nothing but the model", "Each engine has pages of its own", "数据并行", "One more"]
REPLICAS = ("0", "1")


def in_flight(served, replica):
    return (read_metric(served, "dsa_requests_running", replica=replica)
            + read_metric(served, "dsa_requests_waiting", replica=replica))


def pages_free(served, replica):
    return read_metric(served, "dsa_kv_pages_free", pool="mla", replica=replica)


def long_streams(served, n, tokens, cancel_after=None):
    """n greedy streams of `tokens` tokens at once, each as a thread; their Completions by index."""
    results = {}

    def stream(i):
        results[i] = generate(served.grpc_url, PROMPTS[i % len(PROMPTS)], tokens, min_tokens=tokens,
                              temperature=0.0, cancel_after=cancel_after, timeout_s=180)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def test_two_replicas_start_and_serve_concurrent_streams_with_the_offline_llms_text(served, offline_llm):
    found = re.findall(r"dsa_llm: engine ready on device (\S+), dtype \w+ \(instance kind \w+\) as replica (\d) of 2",
                       served.log_file.read_text(errors="replace"))
    expected_devices = ["cuda:0", "cuda:1"] if torch.cuda.is_available() else ["cpu", "cpu"]
    assert sorted(found, key=lambda f: f[1]) == list(zip(expected_devices, REPLICAS)), served.log_errors()
    assert len(engine_processes(served)) == 2
    assert_concurrent_streams_match(served, offline_llm, PROMPTS)


def test_requests_go_to_the_replica_with_fewest_in_flight_and_each_reports_its_gauges(served):
    for replica in REPLICAS:
        assert settle(lambda: in_flight(served, replica), 0) == 0
    idle = [pages_free(served, r) for r in REPLICAS]
    threads, results = long_streams(served, 4, 150)
    # four requests submitted while none has ended: two on each replica, holding pages on each
    split = [settle(lambda r=r: in_flight(served, r), 2) for r in REPLICAS]
    held = [pages_free(served, r) < free for r, free in zip(REPLICAS, idle)]
    for t in threads:
        t.join(240)
    assert split == [2, 2]
    assert held == [True, True]
    assert all(results[i].error is None and results[i].num_output_tokens == 150 for i in range(4))
    assert [settle(lambda r=r: pages_free(served, r), free) for r, free in zip(REPLICAS, idle)] == idle


def test_a_cancelled_stream_is_aborted_on_its_own_replica(served):
    # Through the ensemble, postprocessing asks dsa_llm to abort a cancelled request; with an
    # instance a GPU that call could reach the other one. Here one instance routes it.
    idle = [pages_free(served, r) for r in REPLICAS]
    aborted_before = read_metric(served, "dsa_requests_total", finish_reason="abort") or 0
    threads, results = long_streams(served, 2, 400, cancel_after=3)
    for t in threads:
        t.join(120)
    assert all(not results[i].final for i in range(2))
    assert [settle(lambda r=r: in_flight(served, r), 0) for r in REPLICAS] == [0, 0]
    assert [settle(lambda r=r: pages_free(served, r), free) for r, free in zip(REPLICAS, idle)] == idle

    def aborted():
        # counted with each final response, which the sender may still hold when the engine's
        # gauges already show the requests gone; absent until the server's first abort
        return (read_metric(served, "dsa_requests_total", finish_reason="abort") or 0) - aborted_before

    assert settle(aborted, 2) == 2


def next_turn_beside_a_long_stream(served):
    """A conversation's first turn, then a long stream on the replica that served it (ties go to
    the first), then its next turn: -> (first, next turn, the busy replica)."""
    for replica in REPLICAS:
        assert settle(lambda: in_flight(served, replica), 0) == 0
    turn = ("The system prompt of a long conversation, long enough to fill several pages of the KV cache, "
            "tells the assistant to answer briefly and to keep every earlier turn in mind, since a user "
            "who asks a second question expects the answer to build on the first one. User: what is "
            "data parallelism, and why does each replica keep a prefix cache of its own? Assistant:")
    first = generate(served.grpc_url, turn, 8, temperature=0.0, exclude_input_in_output=True, timeout_s=120)
    assert first.error is None and first.num_input_tokens >= 64
    threads, results = long_streams(served, 1, 300)
    assert settle(lambda: in_flight(served, "0") + in_flight(served, "1"), 1) == 1
    busy = [in_flight(served, r) for r in REPLICAS].index(1)
    second = generate(served.grpc_url, turn + first.text + " User: and tensor parallelism? Assistant:", 8,
                      temperature=0.0, timeout_s=120)
    for t in threads:
        t.join(240)
    assert second.error is None and results[0].error is None
    return first, second, busy


def test_a_conversations_next_turn_goes_to_the_replica_that_cached_its_earlier_turn(served):
    first, second, busy = next_turn_beside_a_long_stream(served)
    # the next turn went to the busier replica, and found the first turn's whole pages cached there
    assert second.num_cached_tokens >= first.num_input_tokens - first.num_input_tokens % 16 - 16 > 0
    assert busy == 0


def test_loadgen_conversations_find_their_history_cached_turn_after_turn(served):
    # dsa_client.loadgen --turns 3: four conversations at once over the two replicas; each later
    # turn resends the one before it and its reply, and finds their whole pages cached (sent to a
    # replica by load alone, about half of them would not)
    turns = 3
    [summary] = sweep(served.grpc_url, make_requests(4, 40, 6, seed=3, turns=turns), [4], timeout_s=120,
                      show_progress=False)
    assert summary["requests"] == 4 * turns and summary["errors"] == 0
    completions = run_concurrency(served.grpc_url, make_requests(4, 40, 6, seed=4, turns=turns), 4, 120)[0]
    for i in range(0, len(completions), turns):
        conversation = completions[i:i + turns]
        for before, after in zip(conversation, conversation[1:]):
            assert after.num_cached_tokens >= before.num_input_tokens - before.num_input_tokens % 16 - 16 > 0
    assert summary["prefix_cache_hit_rate"] > 0.3


def test_while_a_replicas_engine_restarts_the_other_takes_every_request(served):
    victim = engine_processes(served)[0]
    log_size = served.log_file.stat().st_size

    def log_since() -> str:
        return served.log_file.read_bytes()[log_size:].decode(errors="replace")

    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while "engine process has exited (code -9)" not in log_since() and time.monotonic() < deadline:
        time.sleep(0.1)
    # four at once: by load alone two would go to the replica that is starting again, and fail
    threads, results = long_streams(served, 4, 24)
    for t in threads:
        t.join(120)
    restarting = "the engine process was restarted" not in log_since()
    assert [results[i].error for i in range(4)] == [None] * 4
    deadline = time.monotonic() + 120
    while "the engine process was restarted" not in log_since() and time.monotonic() < deadline:
        time.sleep(0.2)
    processes = engine_processes(served)
    assert restarting and len(processes) == 2 and victim not in processes
    threads, results = long_streams(served, 4, 24)     # and both serve again
    for t in threads:
        t.join(120)
    assert [results[i].error for i in range(4)] == [None] * 4
