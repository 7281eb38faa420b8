"""Stopping the server with requests in flight ends each with a final response, within the timeout."""

from __future__ import annotations

import threading
import time

from dsa_client.grpc_stream import generate


def test_shutdown_ends_in_flight_requests_with_a_final_response(served):
    results = {}
    started = threading.Barrier(5)

    def client(i):
        first = threading.Event()
        def on_delta(_):
            if not first.is_set():
                first.set()
                started.wait(60)
        results[i] = generate(served.grpc_url, f"Story {i}: once upon a time", 400, temperature=0.0,
                              on_delta=on_delta, timeout_s=120)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(60)                    # every request has streamed text
    begin = time.monotonic()
    code = served.stop(timeout_s=30)
    took = time.monotonic() - begin
    for t in threads:
        t.join(30)
    assert took < 30, took
    assert code == 0, served.log_errors()
    assert sorted(results) == [0, 1, 2, 3]
    for c in results.values():
        assert c.final and c.error is None, c.error
        assert c.finish_reason == "abort"
        assert 0 < c.num_output_tokens < 400
