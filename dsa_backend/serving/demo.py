"""The demo: serve the tiny checkpoint, stream one completion over gRPC with timings, stop.

    python -m dsa_backend.serving.demo --model checkpoints/tiny-glm   (`make demo`)

The tiny checkpoint has random weights, so the text is word salad; the point is the path:
tokenizer, continuous-batching engine and detokenizer behind a streaming Triton ensemble.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from dsa_backend.serving.fill_template import fill
from dsa_backend.serving.server import TritonServer
from dsa_client.grpc_stream import generate
from dsa_client.stream import format_timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="checkpoints/tiny-glm")
    parser.add_argument("--prompt", default="DeepSeek Sparse Attention serves long contexts by")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default="runs/demo", help="filled model repository and server log")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    began = time.perf_counter()
    repository = fill(args.model, f"{args.out}/model_repository", {"num_kv_pages": "256"})
    with TritonServer(repository, log_file=f"{args.out}/tritonserver.log") as server:
        print(f"tritonserver ready in {time.perf_counter() - began:.1f} s (gRPC {server.grpc_url}); "
              f"streaming {args.max_tokens} tokens for: {args.prompt!r}\n")
        completion = generate(server.grpc_url, args.prompt, args.max_tokens, temperature=0.0,
                              exclude_input_in_output=True, on_delta=lambda d: print(d, end="", flush=True))
        print("\n")
        if completion.error:
            print(f"error: {completion.error}", file=sys.stderr)
            return 1
        print(format_timing(completion))
    print(f"server stopped; demo took {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
