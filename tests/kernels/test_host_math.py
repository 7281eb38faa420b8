"""The launch wrappers' integer helpers against Triton's own (which cost ~2 µs a call from Python)."""

import triton

from dsa_kernels.host_math import cdiv, next_power_of_2


def test_cdiv_matches_triton():
    for a in range(0, 300):
        for b in (1, 2, 3, 63, 64, 128, 1024):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_next_power_of_2_matches_triton():
    for n in range(1, 5000):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
    assert next_power_of_2(0) == 1
