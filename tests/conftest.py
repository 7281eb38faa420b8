"""Shared fixtures: small random checkpoints of both architectures, made once per session."""

from __future__ import annotations

import sys
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


@pytest.fixture(autouse=True)
def batch_invariant_mode_ends_with_its_test():
    """A GPU test that enables batch-invariant mode (an Engine with batch_invariant=True) patches
    aten for the process; later tests in it would capture CUDA graphs through the patched GEMMs."""
    yield
    module = sys.modules.get("dsa_kernels.batch_invariant")
    if module is not None and module.enabled():
        module.disable_batch_invariant_mode()
