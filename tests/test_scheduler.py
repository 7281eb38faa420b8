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


def compute(chunks) -> None:
    for ch in chunks:
        ch.seq.num_computed += ch.num_tokens


def test_a_request_starts_after_its_cached_prefix_and_computes_its_last_token():
    s = Scheduler(PageAllocator(16), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a = seq(0, 10)
    s.add(a)
    compute(s.schedule())
    cached = a.pages[:2]
    s.finish(a, "stop")                    # its two whole pages stay cached
    b, c = seq(1, 12), seq(2, 8)           # b shares a's 10 tokens; c's prompt is exactly a's two pages
    s.add(b)
    s.add(c)
    chunks = s.schedule()
    assert [(ch.start, ch.num_tokens) for ch in chunks] == [(8, 4), (4, 4)]
    assert b.pages[:2] == cached and c.pages[:1] == cached[:1] and s.num_cached_tokens == 8 + 4


def test_pages_are_cached_while_their_request_runs():
    s = Scheduler(PageAllocator(16), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a = seq(0, 9)
    s.add(a)
    compute(s.schedule())
    b = seq(1, 9)
    s.add(b)
    a.output_ids.append(5)
    chunks = s.schedule()                  # a's two whole pages are cached as this step is planned
    assert [(ch.seq, ch.start) for ch in chunks] == [(a, 9), (b, 8)]
    assert b.pages[:2] == a.pages[:2]


def test_a_waiting_request_that_does_not_fit_holds_no_cached_pages():
    alloc = PageAllocator(4)
    s = Scheduler(alloc, page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a = seq(0, 8)
    s.add(a)
    compute(s.schedule())
    s.finish(a, "stop")
    big = seq(1, 24)                       # matches a's two pages, needs four more
    s.add(big)
    assert s.schedule() == []
    assert big.pages == [] and big.num_computed == 0 and s.pages.num_available == 4


def test_a_retracted_request_resumes_from_its_cached_pages():
    alloc = PageAllocator(5)
    s = Scheduler(alloc, page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a, b = seq(0, 8), Sequence("r1", list(range(100, 109)), SamplingParams(max_tokens=4), arrival=1)
    s.add(a)
    s.add(b)
    for ch in s.schedule():
        ch.seq.num_computed += ch.num_tokens
        ch.seq.output_ids.append(1)
    assert s.pages.num_available == 0
    assert [ch.seq for ch in s.schedule()] == [a]    # a's 9th token needs a page: b is retracted
    assert b.status is SequenceStatus.WAITING and s.pages.num_cached == 4
    s.finish(a, "stop")
    chunks = s.schedule()
    assert [(ch.seq, ch.start, ch.num_tokens) for ch in chunks] == [(b, 8, 2)]



def test_a_request_waits_for_the_pages_a_running_request_computes_then_starts_on_them():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a, b = seq(0, 14), seq(1, 14)          # one prompt sampled twice: three whole pages in common
    c = Sequence("r2", list(range(100, 106)), SamplingParams(max_tokens=4), arrival=2)  # not held up
    for r in (a, b, c):
        s.add(r)
    chunks = s.schedule()
    assert [ch.seq for ch in chunks] == [a, c]
    assert list(s.waiting) == [b] and b.pages == [] and b.num_computed == 0
    compute(chunks)
    a.output_ids.append(1)
    c.output_ids.append(1)
    chunks = s.schedule()
    assert [(ch.seq, ch.start, ch.num_tokens) for ch in chunks] == [(a, 14, 1), (c, 6, 1), (b, 12, 2)]
    assert b.pages[:3] == a.pages[:3] and s.num_cached_tokens == 12


def test_a_chunked_prefill_holds_its_followers_until_the_pages_they_share_are_computed():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=8, prefix_caching=True)
    a, b = seq(0, 20), seq(1, 20)
    s.add(a)
    s.add(b)
    for start in (0, 8):
        chunks = s.schedule()
        assert [(ch.seq, ch.start) for ch in chunks] == [(a, start)]
        compute(chunks)
    # a's last chunk computes its last page, which holds its last token: b computes its own
    assert [(ch.seq, ch.start, ch.num_tokens) for ch in s.schedule()] == [(a, 16, 4), (b, 16, 4)]
    assert b.pages[:4] == a.pages[:4]


def test_a_small_overlap_does_not_hold_a_request_back():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a = seq(0, 20)
    b = Sequence("r1", list(range(4)) + list(range(100, 116)), SamplingParams(max_tokens=4), arrival=1)
    s.add(a)
    s.add(b)
    assert [ch.seq for ch in s.schedule()] == [a, b]   # one page of 20 tokens in common: b computes it too


def test_a_held_request_starts_alone_when_the_request_computing_its_pages_goes():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a, b = seq(0, 14), seq(1, 14)
    s.add(a)
    s.add(b)
    assert [ch.seq for ch in s.schedule()] == [a]
    s.finish(a, "abort")                   # aborted before its pages were computed: none cached
    assert [(ch.seq, ch.start, ch.num_tokens) for ch in s.schedule()] == [(b, 0, 14)]


def test_nothing_is_held_back_without_prefix_caching():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=64)
    a, b = seq(0, 14), seq(1, 14)
    s.add(a)
    s.add(b)
    assert [ch.seq for ch in s.schedule()] == [a, b]


def ranked(i: int, prompt_len: int, priority: int) -> Sequence:
    return Sequence(f"r{i}", list(range(100 * i, 100 * i + prompt_len)), SamplingParams(max_tokens=4), arrival=i,
                    priority=priority)


def test_requests_wait_in_priority_order_then_arrival():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=1, max_batched_tokens=64)
    late, early, urgent, also_urgent = ranked(0, 4, 1), ranked(1, 4, 1), ranked(2, 4, -3), ranked(3, 4, -3)
    for r in (late, early, urgent, also_urgent):
        s.add(r)
    assert list(s.waiting) == [urgent, also_urgent, late, early]


def test_an_outranking_request_retracts_the_lowest_priority_newest_running_one_for_a_slot():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=3, max_batched_tokens=64)
    low_old, low_new, mid = ranked(0, 4, 5), ranked(1, 4, 5), ranked(2, 4, 1)
    for r in (low_old, low_new, mid):
        s.add(r)
    compute(s.schedule())
    urgent = ranked(3, 4, 0)
    s.add(urgent)
    chunks = s.schedule()
    assert [ch.seq for ch in chunks if ch.start == 0] == [urgent]
    assert list(s.waiting) == [low_new] and s.num_retractions == 1 and low_new.pages == []
    # one of the running ones' lowest priority waits: it never retracts
    peer = ranked(4, 4, 5)
    s.add(peer)
    compute(chunks)
    assert peer not in [ch.seq for ch in s.schedule()] and s.num_retractions == 1


def test_an_outranking_request_retracts_lower_ones_until_its_first_chunk_has_pages():
    s = Scheduler(PageAllocator(6), page_size=4, max_running=8, max_batched_tokens=64)
    a, b, c = ranked(0, 8, 2), ranked(1, 8, 3), ranked(2, 8, 3)        # two pages each: the pool is full
    for r in (a, b, c):
        s.add(r)
    compute(s.schedule())
    urgent = ranked(3, 16, 0)                                           # needs four pages
    s.add(urgent)
    chunks = s.schedule()
    assert urgent in [ch.seq for ch in chunks] and a in s.running
    assert list(s.waiting) == [b, c]                                    # c first, then b: b is older


def test_an_outranking_request_counts_its_cached_prefix_and_retracts_no_more_than_its_new_pages_need():
    s = Scheduler(PageAllocator(6), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    a, b, c = ranked(0, 8, 2), ranked(1, 8, 3), ranked(2, 8, 3)        # two pages each: the pool is full
    for r in (a, b, c):
        s.add(r)
    compute(s.schedule())
    # a's two pages and four tokens more: one new page (three if its prefix were not cached)
    urgent = Sequence("r3", a.prompt_ids + [7, 8, 9, 10], SamplingParams(max_tokens=4), arrival=3, priority=0)
    s.add(urgent)
    chunks = s.schedule()
    assert [(ch.seq, ch.start) for ch in chunks if ch.seq is urgent] == [(urgent, 8)]
    assert list(s.waiting) == [c] and b in s.running and s.num_retractions == 1


def test_an_outranking_request_counts_the_unheld_cached_pages_it_takes_as_pages_it_needs():
    s = Scheduler(PageAllocator(5), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    done, low = ranked(0, 8, 5), ranked(1, 12, 5)
    for r in (done, low):
        s.add(r)
    compute(s.schedule())
    s.finish(done, "stop")                  # its two pages stay cached, held by nobody: available
    assert s.pages.num_available == 2
    # done's two pages and four tokens more: it takes both available pages and needs one new one
    urgent = Sequence("r2", done.prompt_ids + [7, 8, 9, 10], SamplingParams(max_tokens=4), arrival=2, priority=0)
    s.add(urgent)
    chunks = s.schedule()
    assert [(ch.seq, ch.start) for ch in chunks if ch.seq is urgent] == [(urgent, 8)]
    assert list(s.waiting) == [low] and s.num_retractions == 1


def test_pages_for_a_running_request_come_from_the_lowest_priority_one():
    alloc = PageAllocator(4)
    s = Scheduler(alloc, page_size=4, max_running=8, max_batched_tokens=64)
    old_low, new_high = ranked(0, 8, 9), ranked(1, 8, 0)
    s.add(old_low)
    s.add(new_high)
    compute(s.schedule())
    for r in (old_low, new_high):
        r.output_ids.append(1)
    chunks = s.schedule()       # new_high's 9th token needs a page: old_low goes, though older
    assert [ch.seq for ch in chunks] == [new_high] and list(s.waiting) == [old_low]
