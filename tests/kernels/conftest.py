"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter, at tiny sizes.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it when a
kernel is defined), so it is set here, when this conftest is configured during collection. A run
that selects GPU tests (`-m gpu`) leaves it unset: the environment is the whole session's, and
the GPU tests elsewhere must run compiled kernels.
"""

import os
import re

import pytest
import torch


def pytest_configure(config):
    if not re.search(r"(?<!not )\bgpu\b", config.getoption("markexpr") or ""):
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _not_under_process_wide_batch_invariance():
    """The GPU tests of tests/test_batch_invariance.py turn batch-invariant mode on for their whole
    process (it patches aten), and kernel tests after them would run under the mode: splits that
    never meet, other split counts. Say so instead of failing on those."""
    import sys

    mode = sys.modules.get("dsa_kernels.batch_invariant")
    if mode is not None and mode.enabled():
        pytest.fail("batch-invariant mode is on for this whole process (tests/test_batch_invariance.py ran "
                    "first): run the kernel tests in a process of their own, as benchmarks/device_checks.sh does")
