"""Prefix cache: matching whole pages by their prefix, sharing, release, eviction order."""

from __future__ import annotations

import pytest

from dsa_backend.cache import OutOfPages, PageAllocator, PrefixCache
from dsa_backend.cache.prefix_cache import page_keys

PAGE = 4


def keys(tokens: list[int]) -> list[bytes]:
    return page_keys(tokens, PAGE)


def match(cache: PrefixCache, tokens: list[int]) -> list[int]:
    return cache.match(keys(tokens))


def cached_request(cache: PrefixCache, tokens: list[int]) -> tuple[list[int], int]:
    """A request that computed `tokens` in pages of its own and cached every whole one."""
    pages = cache.allocate(-(-len(tokens) // PAGE))
    return pages, cache.insert(pages, 0, keys(tokens))


def test_match_holds_the_longest_run_of_whole_cached_pages():
    cache = PrefixCache(PageAllocator(16))
    pages, held = cached_request(cache, list(range(10)))            # pages of 0-3, 4-7; 8-9 not whole
    assert held == 2 and cache.num_cached == 2
    assert match(cache, list(range(12))) == pages[:2]
    assert match(cache, list(range(7))) == pages[:1]                  # 4-6 is not a whole page
    assert match(cache, [0, 1, 2, 9, 4, 5, 6, 7]) == []               # the first page differs
    assert match(cache, list(range(3))) == []


def test_a_page_is_keyed_by_its_whole_prefix_not_its_own_tokens():
    assert keys([1, 2, 3, 4, 5, 6, 7, 8])[1] != keys([9, 9, 9, 9, 5, 6, 7, 8])[1]
    cache = PrefixCache(PageAllocator(16))
    cached_request(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert match(cache, [9, 9, 9, 9, 5, 6, 7, 8]) == []


def test_a_second_copy_of_a_cached_prefix_is_freed_for_the_cached_page():
    alloc = PageAllocator(16)
    cache = PrefixCache(alloc)
    first, _ = cached_request(cache, list(range(8)))
    second = cache.allocate(3)                                       # computed the same 8 tokens + 1
    free_before = alloc.num_free
    assert cache.insert(second, 0, keys(list(range(8)))) == 2
    assert second[:2] == first[:2] and alloc.num_free == free_before + 2
    assert cache.num_cached == 2


def test_released_pages_stay_cached_and_count_as_available():
    alloc = PageAllocator(8)
    cache = PrefixCache(alloc)
    pages, held = cached_request(cache, list(range(10)))
    assert cache.num_available == 5
    cache.release(pages, held)
    assert alloc.num_free == 6 and cache.num_cached == 2 and cache.num_available == 8
    assert match(cache, list(range(9))) == pages[:2]                  # found again after its request ended
    assert cache.num_available == 6


def test_held_pages_are_never_evicted_and_too_large_an_allocation_raises():
    cache = PrefixCache(PageAllocator(4))
    pages, held = cached_request(cache, list(range(8)))
    cache.allocate(2)
    with pytest.raises(OutOfPages, match="asked for 1 pages, 0 available"):
        cache.allocate(1)
    assert match(cache, list(range(9))) == pages


def test_eviction_takes_least_recently_released_leaves_first():
    alloc = PageAllocator(6)
    cache = PrefixCache(alloc)
    shared = list(range(4))
    a, a_held = cached_request(cache, shared + [10, 11, 12, 13])     # chain: shared page, a's page
    b_pages = match(cache, shared + [20, 21, 22, 23, 0])
    b_pages += cache.allocate(1)
    b_held = cache.insert(b_pages, 1, keys(shared + [20, 21, 22, 23]))  # shared page, b's page
    cache.release(a, a_held)                                         # a's leaf released first
    cache.release(b_pages, b_held)
    assert cache.num_cached == 3 and alloc.num_free == 3
    taken = cache.allocate(4)                                        # the free three and one eviction
    assert a[1] in taken and cache.num_cached == 2                   # a's leaf, the oldest
    assert match(cache, shared + [10, 11, 12, 13, 0]) == a[:1]
    assert match(cache, shared + [20, 21, 22, 23, 0]) == b_pages     # b's chain intact
    cache.release(b_pages, 2)
    cache.release(a[:1], 1)
    assert cache.allocate(1) == b_pages[1:]                          # the leaf before its parent
    assert cache.allocate(1) == b_pages[:1]
    assert cache.num_cached == 0


def test_a_disabled_cache_matches_nothing_and_frees_everything():
    alloc = PageAllocator(8)
    cache = PrefixCache(alloc, enabled=False)
    pages, held = cached_request(cache, list(range(8)))
    assert held == 0 and cache.num_cached == 0
    cache.release(pages, held)
    assert alloc.num_free == 8 and match(cache, list(range(9))) == []
