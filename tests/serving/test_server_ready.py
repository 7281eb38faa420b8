"""TritonServer.wait_ready returns only once the metrics endpoint answers too, not at the first
ready HTTP health check: tritonserver starts its metrics service after its HTTP service, and a
scrape right after start() was once refused (the real server runs in test_server_e2e.py; here
two stand-in endpoints isolate the ordering)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from dsa_backend.serving.server import Ports, TritonServer


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class _Running:
    """A server process that has not exited."""

    returncode = None

    def poll(self):
        return None


@pytest.fixture
def endpoints():
    started = []

    def serve(port):
        server = HTTPServer(("127.0.0.1", port), _Ok)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)

    yield serve
    for server in started:
        server.shutdown()
        server.server_close()


def _server(tmp_path, extra_args=()):
    server = TritonServer(tmp_path / "model_repository", Ports.free(), install=object(), extra_args=extra_args)
    server.process = _Running()
    return server


def test_ready_waits_for_the_metrics_endpoint(tmp_path, endpoints):
    server = _server(tmp_path)
    endpoints(server.ports.http)
    threading.Timer(0.6, endpoints, (server.ports.metrics,)).start()
    began = time.monotonic()
    server.wait_ready(timeout_s=10)
    assert time.monotonic() - began >= 0.5


def test_ready_names_the_endpoint_that_never_answered(tmp_path, endpoints):
    server = _server(tmp_path)
    endpoints(server.ports.http)
    with pytest.raises(TimeoutError, match="metrics"):
        server.wait_ready(timeout_s=0.6)


def test_metrics_turned_off_are_not_waited_for(tmp_path, endpoints):
    server = _server(tmp_path, extra_args=("--allow-metrics=false",))
    endpoints(server.ports.http)
    server.wait_ready(timeout_s=5)
