"""The served engine's process killed: the request in flight gets an error response naming it, the
model starts the engine again, later requests get the same text as before, and the metrics go on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from dsa_client.grpc_stream import generate


def engine_processes(server) -> list[int]:
    """The pids of the server's engine processes: descendants of tritonserver spawned by multiprocessing."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [server.process.pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
            except OSError:
                pass
    return found


def greedy(url, prompt, max_tokens, **kw):
    return generate(url, prompt, max_tokens, temperature=0.0, exclude_input_in_output=True, timeout_s=120, **kw)


def test_a_killed_engine_process_fails_its_requests_and_comes_back(served, metric):
    prompt = "The engine process may die; the server should not"
    before = greedy(served.grpc_url, prompt, 8)
    assert before.error is None, before.error
    [engine] = engine_processes(served)
    errors_before = metric("dsa_requests_total", finish_reason="error") or 0

    started, result = threading.Event(), {}

    def long_request():
        result["c"] = greedy(served.grpc_url, prompt, 400, min_tokens=400, on_delta=lambda _: started.set())

    worker = threading.Thread(target=long_request)
    worker.start()
    assert started.wait(60)
    os.kill(engine, signal.SIGKILL)
    worker.join(60)
    assert "engine process has exited (code -9)" in (result["c"].error or ""), result["c"].error

    deadline, after = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        after = greedy(served.grpc_url, prompt, 8)
        if after.error is None:
            break
        assert "engine process has exited" in after.error, after.error     # refused while it restarts
        time.sleep(0.5)
    assert after.error is None, after.error
    assert after.text == before.text
    [restarted] = engine_processes(served)
    assert restarted != engine
    assert metric("dsa_requests_total", finish_reason="error") > errors_before
    assert metric("dsa_requests_running") == 0
