"""Scheduler policy: token budget, chunking, FIFO admission, running cap, retraction, finish."""

from __future__ import annotations

from dsa_backend.cache import PageAllocator
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.scheduler import Scheduler
from dsa_backend.sequence import Sequence, SequenceStatus


def seq(i: int, prompt_len: int) -> Sequence:
    return Sequence(f"r{i}", list(range(prompt_len)), SamplingParams(max_tokens=4), arrival=i)


def test_prefill_is_chunked_by_the_token_budget():
    s = Scheduler(PageAllocator(16), page_size=4, max_running=8, max_batched_tokens=10)
    a = seq(0, 25)
    s.add(a)
    sizes = []
    while a.num_uncomputed:
        (chunk,) = s.schedule()
        sizes.append(chunk.num_tokens)
        a.num_computed += chunk.num_tokens
    assert sizes == [10, 10, 5] and len(a.pages) == 7


def test_running_requests_go_first_then_waiting_in_arrival_order():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=12)
    a, b, c = seq(0, 4), seq(1, 6), seq(2, 6)
    s.add(a)
    (chunk,) = s.schedule()
    a.num_computed += 4
    a.output_ids.append(7)  # a now decodes one token
    s.add(b)
    s.add(c)
    chunks = s.schedule()
    assert [(ch.seq, ch.num_tokens) for ch in chunks] == [(a, 1), (b, 6), (c, 5)]


def test_waiting_request_that_does_not_fit_blocks_later_ones():
    s = Scheduler(PageAllocator(3), page_size=4, max_running=8, max_batched_tokens=64)
    big, small = seq(0, 16), seq(1, 2)
    s.add(big)
    s.add(small)
    assert s.schedule() == []  # big needs 4 pages of 3; small must not jump ahead
    assert list(s.waiting) == [big, small]


def test_running_cap_is_respected():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=2, max_batched_tokens=64)
    for i in range(3):
        s.add(seq(i, 3))
    assert len(s.schedule()) == 2 and len(s.waiting) == 1


def test_out_of_pages_retracts_the_newest_request_and_frees_its_pages():
    alloc = PageAllocator(4)
    s = Scheduler(alloc, page_size=4, max_running=8, max_batched_tokens=64)
    a, b = seq(0, 8), seq(1, 8)
    s.add(a)
    s.add(b)
    for ch in s.schedule():
        ch.seq.num_computed += ch.num_tokens
        ch.seq.output_ids.append(1)
    assert alloc.num_free == 0
    chunks = s.schedule()  # a's 9th token needs a page: b (newer) is retracted
    assert [ch.seq for ch in chunks] == [a]
    assert b.status is SequenceStatus.WAITING and b.pages == [] and b.num_computed == 0
    assert s.waiting[0] is b and s.num_retractions == 1


def test_finish_frees_pages_of_running_and_waiting_requests():
    alloc = PageAllocator(8)
    s = Scheduler(alloc, page_size=4, max_running=1, max_batched_tokens=64)
    a, b = seq(0, 8), seq(1, 8)
    s.add(a)
    s.add(b)
    s.schedule()
    s.finish(a, "abort")
    s.finish(b, "abort")
    assert alloc.num_free == 8 and not s.has_work()
    assert a.finish_reason == "abort" and a.is_finished
