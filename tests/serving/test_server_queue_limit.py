"""max_queued_requests: an overloaded server refuses new requests at once, saying why, and serves
the ones it took."""

from __future__ import annotations

import threading
import time

from dsa_client.grpc_stream import generate

# one running request at a time, and one may wait
SERVER_SETTINGS = {"max_running_requests": "1", "max_queued_requests": "1"}


def test_a_request_past_the_queue_limit_is_refused_and_the_others_are_served(served, metric):
    first_token, results = threading.Event(), {}

    def send(name, max_tokens, on_delta=None):
        results[name] = generate(served.grpc_url, f"Request {name}", max_tokens, temperature=0.0,
                                 on_delta=on_delta, timeout_s=300)

    # long enough to still run when the refused one comes, on a loaded machine too
    running = threading.Thread(target=send, args=("running", 400, lambda _: first_token.set()))
    running.start()
    assert first_token.wait(120)
    queued = threading.Thread(target=send, args=("queued", 8))
    queued.start()
    deadline = time.monotonic() + 60
    while metric("dsa_requests_waiting") != 1:
        assert time.monotonic() < deadline, "the second request never waited"
        time.sleep(0.05)
    refused = generate(served.grpc_url, "Request refused", 8, timeout_s=60)
    assert refused.error is not None and "max_queued_requests=1" in refused.error
    assert refused.times[-1] < 5                      # at once, not after the queue drained
    running.join(300)
    queued.join(300)
    assert results["running"].error is None and results["queued"].error is None
    assert results["queued"].num_output_tokens == 8
    assert metric("dsa_requests_total", finish_reason="rejected") == 1
    assert generate(served.grpc_url, "Request after", 4, timeout_s=60).error is None
