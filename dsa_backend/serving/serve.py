"""Serve a checkpoint: fill the model repository for it and run tritonserver until interrupted.

    python -m dsa_backend.serving.serve --model CHECKPOINT_DIR [--set num_kv_pages=4096 ...]

(`make serve MODEL=DIR`.) Ctrl-C or SIGTERM drains in-flight requests, then stops the server.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from dsa_backend.serving.fill_template import DEFAULTS, fill, parse_sets
from dsa_backend.serving.server import Ports, TritonServer

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"model repository parameter; known: {', '.join(sorted(DEFAULTS))}")
    parser.add_argument("--repository", default="runs/serve/model_repository",
                        help="where the filled model repository is written")
    parser.add_argument("--address", default="127.0.0.1", help="0.0.0.0 to listen on every interface")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--exit-timeout-s", type=int, default=30)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    repository = fill(args.model, args.repository, parse_sets(args.set))
    server = TritonServer(repository, Ports(args.http_port, args.grpc_port, args.metrics_port),
                          log_file=Path(args.repository).parent / "tritonserver.log",
                          exit_timeout_s=args.exit_timeout_s, address=args.address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with server:
        logger.info("serving %s: gRPC %s, HTTP 127.0.0.1:%d, metrics %s (log: %s); Ctrl-C stops",
                    args.model, server.grpc_url, args.http_port, server.metrics_url, server.log_file)
        while not stop.wait(1.0):
            if server.process.poll() is not None:
                raise SystemExit(f"tritonserver exited with {server.process.returncode}:\n{server.log_errors()}")
        logger.info("stopping")


if __name__ == "__main__":
    main()
