"""Serving test helpers: the engine settings of the served model, starting a server, reading its metrics."""

from __future__ import annotations

import os
import re
import threading
import urllib.request

import torch

# Engine settings shared by the served model and the offline LLM that checks its text. device and
# dtype stay `auto` (fill_template's defaults), as a user's would: KIND_GPU (KIND_MODEL where there
# are several GPUs), cuda and bfloat16 where the tests run with a GPU, KIND_CPU, cpu and float32
# elsewhere; one engine (test_server_data_parallel.py serves two). DSA_SERVING_TEST_DTYPE overrides
# the dtype of both (e.g. float32 on the GPU, to tell numerics from serving bugs).
ENGINE = {"page_size": "16", "num_kv_pages": "64", "max_model_len": "512", "max_running_requests": "64",
          "data_parallel_size": "1", "dtype": os.environ.get("DSA_SERVING_TEST_DTYPE", "auto")}

# For the modules whose reference ran in another batch than the served request (solo vs 32 at once,
# a roomy pool vs retractions): on a GPU, cuBLAS picks other kernels for other batch sizes, so in
# bfloat16 greedy text can part at a near-tie (seen on an H200: one of 32 streams). Those modules
# serve with batch_invariant=true there (the offline reference too), which is what makes them equal.
BATCH_INVARIANT = {"batch_invariant": "true"} if torch.cuda.is_available() else {}


def served_device(settings: dict[str, str]) -> str:
    """Where the served engine runs: what dsa_llm resolves for the filled instance_kind and device."""
    device = settings.get("device", "auto")
    if device != "auto":
        return device
    kind = settings.get("instance_kind", "auto")
    if kind == "auto":   # as fill_template decides
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        kind = "KIND_CPU" if not gpus else "KIND_GPU" if gpus == 1 else "KIND_MODEL"
    # KIND_GPU: the instance's GPU (one instance, so GPU 0); KIND_MODEL: the engine's own auto.
    return {"KIND_GPU": "cuda:0", "KIND_CPU": "cpu"}.get(kind, "cuda:0" if torch.cuda.is_available() else "cpu")


def engine_kwargs(settings: dict[str, str]) -> dict:
    """The offline LLM's arguments for the same engine as the server's: same device, dtype and pools."""
    return {"device": served_device(settings), "dtype": settings.get("dtype", "auto"),
            "page_size": int(settings["page_size"]),
            "num_kv_pages": int(settings["num_kv_pages"]), "max_model_len": int(settings["max_model_len"]),
            "max_running_requests": int(settings["max_running_requests"]),
            "batch_invariant": settings.get("batch_invariant", "false") == "true",
            "fp8_weights": settings.get("fp8_weights", "auto")}


def read_metric(server, name: str, **labels: str) -> float | None:
    """The sum of the matching Prometheus samples on the server's metrics port; None if none match."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = None
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total = (total or 0.0) + float(m.group(3))
    return total


def start_server(request, checkpoint, tmp_path_factory, overrides: dict[str, str], name: str = "glm_moe_dsa"):
    """A tritonserver on a tiny checkpoint (tests/checkpoints.py; the GLM one unless named) with
    ENGINE plus overrides, stopped when the requesting fixture's scope ends (even on failure)."""
    from dsa_backend.serving.fill_template import fill
    from dsa_backend.serving.server import TritonServer

    settings = {**ENGINE, **overrides}
    root = tmp_path_factory.mktemp("triton")
    repo = fill(checkpoint(name), root / "model_repository", settings)
    server = TritonServer(repo, exit_timeout_s=5)
    request.addfinalizer(server.stop)
    server.start(ready_timeout_s=180)
    server.settings = settings
    return server


def assert_concurrent_streams_match(served, offline_llm, prompts: list[str], max_tokens: int = 12,
                                    model: str = "dsa") -> None:
    """Greedy streams of every prompt at once, to `model`, give the offline LLM's text for each."""
    from dsa_backend import SamplingParams
    from dsa_client.grpc_stream import generate

    results = {}

    def stream(prompt):
        results[prompt] = generate(served.grpc_url, prompt, max_tokens, temperature=0.0,
                                   exclude_input_in_output=True, timeout_s=120, model=model)

    threads = [threading.Thread(target=stream, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    expected = offline_llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    for prompt, offline in zip(prompts, expected):
        assert results[prompt].error is None, results[prompt].error
        assert results[prompt].text == offline.text
