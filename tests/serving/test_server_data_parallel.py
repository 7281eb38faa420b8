"""dsa_llm with data_parallel_size 2 in a real tritonserver: two engines (replicas), each in a
process of its own, behind one model instance (dsa_backend/replicas.py). On the CPU both run there;
on a machine of two GPUs, one a GPU. Requests spread over them, each replica reports its own
gauges, and a client's cancellation through the ensemble reaches the replica running the request."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from dsa_backend import SamplingParams
from dsa_client.grpc_stream import generate

from .servers import read_metric
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
    results = {}

    def stream(prompt):
        results[prompt] = generate(served.grpc_url, prompt, 12, temperature=0.0, exclude_input_in_output=True,
                                   timeout_s=120)

    threads = [threading.Thread(target=stream, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    expected = offline_llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0))
    for prompt, offline in zip(PROMPTS, expected):
        assert results[prompt].error is None, results[prompt].error
        assert results[prompt].text == offline.text


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
    # 400 tokens: on a GPU the tiny model makes 150 before the abort arrives
    threads, results = long_streams(served, 2, 400, cancel_after=3)
    for t in threads:
        t.join(120)
    assert all(not results[i].final for i in range(2))
    assert [settle(lambda r=r: in_flight(served, r), 0) for r in REPLICAS] == [0, 0]
    assert [settle(lambda r=r: pages_free(served, r), free) for r, free in zip(REPLICAS, idle)] == idle
    assert settle(lambda: read_metric(served, "dsa_requests_total", finish_reason="abort") - aborted_before, 2) == 2
