"""The CTA pairs' host side on the CPU: reading a build's mbarrier offsets from its PTX. (The pair
kernel's build is checked in test_gluon_compile, its bits and speed on the GPU.)"""

import pytest

from dsa_kernels import cta_pair, sparse_mla_gluon

PTX = """
	mov.u32 	%r7, global_smem;
	add.s32 	%r9, %r7, 231328;
	mbarrier.init.shared::cta.b64 	[%r9], 1;
	mbarrier.init.shared::cta.b64 	[%r9+16], 2;
	mbarrier.init.shared::cta.b64 	[%r9+8], 1;
	add.s32 	%r10, %r7, 231352;
	mbarrier.init.shared.b64 	[%r10], 2;
	mbarrier.init.shared::cta.b64 	[%r7], 1;
"""


def test_mbarrier_offsets_follow_global_smem_through_adds_and_immediates():
    assert cta_pair.mbarrier_offsets(PTX) == [231328, 231344, 231336, 231352, 0]


def test_an_mbarrier_the_reader_cannot_place_is_an_error_not_a_guess():
    with pytest.raises(cta_pair.Unavailable, match=r"\[%r3\]"):
        cta_pair.mbarrier_offsets(PTX + "\tmbarrier.init.shared::cta.b64 \t[%r3], 1;\n")


def _inits(offsets):
    return "\tmov.u32 \t%r1, global_smem;\n" + "".join(
        f"\tmbarrier.init.shared::cta.b64 \t[%r1+{at}], 1;\n" for at in offsets)


def test_the_pair_kernel_takes_ready_and_free_peer_from_the_init_order():
    # ready 0, free 0, ready 1, free 1, p_ready, p_free, done, q_free, free_peer 0, free_peer 1
    at = [100, 116, 108, 124, 132, 140, 148, 156, 164, 172]
    assert sparse_mla_gluon._barrier_offsets(_inits(at)) == (100, 164)
    for wrong in (at[:9], [100, 116, 112] + at[3:], at[:9] + [180]):  # one missing; buffers not 8 bytes apart
        with pytest.raises(cta_pair.Unavailable, match="unexpected mbarrier offsets"):
            sparse_mla_gluon._barrier_offsets(_inits(wrong))
