"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter, at tiny sizes.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it when a
kernel is defined), so it is set here, at collection time.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

