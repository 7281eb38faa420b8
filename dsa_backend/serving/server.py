"""Start a tritonserver on a model repository, wait until it is ready, and always stop it.

A tritonserver has been seen to ignore SIGTERM for most of an hour, so stopping has a deadline
after which the whole process group (server and python backend stubs) gets SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsa_backend.serving.install import ServerInstall, find_server

logger = logging.getLogger(__name__)
_DRAIN_GRACE_S = 0.5
# Ports.free's ports are free when chosen, not when tritonserver binds them: another process (a
# second server started at the same moment) can take one in between. Chosen ports are tried anew.
_PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls) -> "Ports":
        """Three ports free on the loopback interface right now."""
        socks = [socket.socket() for _ in range(3)]
        try:
            for s in socks:
                s.bind(("127.0.0.1", 0))
            return cls(*(s.getsockname()[1] for s in socks))
        finally:
            for s in socks:
                s.close()


class TritonServer:
    """One tritonserver process; use as a context manager or call start() and stop()."""

    def __init__(self, repository: str | Path, ports: Ports | None = None, log_file: str | Path | None = None,
                 exit_timeout_s: int = 10, install: ServerInstall | None = None, extra_args: tuple = (),
                 address: str = "127.0.0.1"):
        self.repository = Path(repository)
        self.chooses_ports = ports is None
        self.ports = ports or Ports.free()
        self.log_file = Path(log_file) if log_file else self.repository.parent / "tritonserver.log"
        self.exit_timeout_s = exit_timeout_s
        self.install = install or find_server()
        self.extra_args = tuple(extra_args)
        self.address = address            # where the endpoints listen; clients here use loopback
        self.process: subprocess.Popen | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def start(self, ready_timeout_s: float = 300) -> "TritonServer":
        """Start and wait until ready; ports this server chose (Ports.free) that another process
        took meanwhile are chosen again, up to _PORT_ATTEMPTS times."""
        if self.process is not None and self.process.poll() is None:
            # a second process would take other ports, and stop() would only reach the newer one
            raise RuntimeError(f"this tritonserver is already running (pid {self.process.pid}); "
                               "`with TritonServer(...)` starts it")
        for _ in range(_PORT_ATTEMPTS - 1):
            log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
            try:
                return self._start(ready_timeout_s)
            except RuntimeError:     # it exited
                if not (self.chooses_ports and b"already in use" in self.log_file.read_bytes()[log_start:]):
                    raise
                logger.warning("a port of %s was taken before tritonserver bound it; trying others", self.ports)
                self.ports = Ports.free()
        return self._start(ready_timeout_s)

    def _start(self, ready_timeout_s: float) -> "TritonServer":
        cmd = [str(self.install.binary), f"--model-repository={self.repository}",
               f"--backend-directory={self.install.backend_dir}",
               f"--http-address={self.address}", f"--grpc-address={self.address}",
               f"--metrics-address={self.address}",
               f"--http-port={self.ports.http}", f"--grpc-port={self.ports.grpc}",
               f"--metrics-port={self.ports.metrics}", f"--exit-timeout-secs={self.exit_timeout_s}",
               *self.extra_args]
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([*map(str, self.install.path_prefix), env.get("PATH", "")])
        if self.install.library_path:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [*map(str, self.install.library_path), *filter(None, [env.get("LD_LIBRARY_PATH")])])
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s (log: %s)", " ".join(cmd), self.log_file)
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Until the models are ready and the metrics endpoint answers: tritonserver reports ready
        over HTTP before its metrics service listens (42 ms later in a log on the 2-core CPU
        machine, where a scrape right after start() was refused)."""
        deadline = time.monotonic() + timeout_s
        urls = [f"http://127.0.0.1:{self.ports.http}/v2/health/ready"]
        if not any(arg.lower() in ("--allow-metrics=false", "--allow-metrics=0")
                   for arg in self.extra_args):
            urls.append(self.metrics_url)
        for url in urls:
            while not self._answers(url):
                if self.process.poll() is not None:
                    raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n{self.log_errors()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s ({url} did not answer):\n"
                                       f"{self.log_errors()}")
                time.sleep(0.25)

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Ask the server to exit; SIGKILL its process group after the deadline. Returns its exit code."""
        if self.process is None:
            return None
        timeout_s = self.exit_timeout_s + 15 if timeout_s is None else timeout_s
        pid = self.process.pid
        try:
            if self.process.poll() is None:
                if self.drain():
                    # dsa_llm has sent every last response; let them pass postprocessing, since
                    # once stopping, Triton fails ensemble steps and waits out the exit timeout.
                    time.sleep(_DRAIN_GRACE_S)
                self.process.send_signal(signal.SIGINT)
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    logger.warning("tritonserver %d still running after %.0f s: killing it", pid, timeout_s)
        finally:
            # The group also holds the python backend stubs, which may outlive the server.
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = self.process.wait()
            self.process = None
        return code

    def drain(self, timeout_s: float = 10) -> bool:
        """Ask dsa_llm to end its in-flight requests now, so that Triton's stop finds none.

        Returns False when there is no dsa_llm to ask (or it did not answer).
        """
        import tritonclient.grpc as grpcclient

        done = threading.Event()
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            if not client.is_model_ready("dsa_llm"):
                return False
            drain = grpcclient.InferInput("drain", [1, 1], "BOOL")
            drain.set_data_from_numpy(np.array([[True]]))
            client.start_stream(callback=lambda result, error: done.set())
            client.async_stream_infer("dsa_llm", [drain], enable_empty_final_response=True)
            return done.wait(timeout_s)
        except Exception:
            logger.warning("draining dsa_llm failed; stopping anyway", exc_info=True)
            return False
        finally:
            client.stop_stream()
            client.close()

    def log_errors(self, max_lines: int = 20) -> str:
        """The server log's error lines (model load failures name the model) and its last lines."""
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [line for line in lines if line.startswith("E") or "Traceback" in line]
        return "\n".join([*errors[-max_lines:], "...", *lines[-3:]])

    def __enter__(self) -> "TritonServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
