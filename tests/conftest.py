"""Shared fixtures: small random checkpoints of both architectures, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoints import CHECKPOINTS
from dsa_backend.tools.make_checkpoint import make_config, write_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> directory of a tiny checkpoint from CHECKPOINTS, built on first use."""
    root = tmp_path_factory.mktemp("checkpoints")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            spec = dict(CHECKPOINTS[name])
            cfg = make_config(spec.pop("arch"), "tiny", **spec)
            write_checkpoint(cfg, root / name, seed=1)
            made[name] = root / name
        return made[name]

    return get
