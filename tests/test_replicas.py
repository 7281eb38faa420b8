"""dsa_backend.replicas: where each replica runs, and PrefixRouter's choice of replica for a prompt
(served end to end in tests/serving/test_server_data_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from dsa_backend.engine import EngineArgs
from dsa_backend.replicas import LeastBusyRouter, PrefixRouter, Replicas, make_router, replica_args

PAGE = 4


def pages(*firsts: int) -> list[int]:
    """A prompt of whole pages, the i-th page's tokens counting up from firsts[i]."""
    return [t for first in firsts for t in range(first, first + PAGE)]


def test_replicas_take_their_gpus_one_after_another_from_the_device():
    args = EngineArgs(model="m", device="cuda:2", tensor_parallel_size=2)
    assert [replica_args(args, r).device for r in range(3)] == ["cuda:2", "cuda:4", "cuda:6"]
    on_cpu = EngineArgs(model="m", device="cpu")
    assert replica_args(on_cpu, 1) is on_cpu


def test_too_few_gpus_are_refused_before_any_engine_starts():
    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"data_parallel_size=2 x tensor_parallel_size={gpus + 1} needs "
                                         f"{2 * gpus + 2} GPUs from cuda:0; this machine has {gpus}"):
        Replicas(EngineArgs(model="m", device="cuda:0", tensor_parallel_size=gpus + 1), 2)
    with pytest.raises(ValueError, match="data_parallel_size must be positive"):
        Replicas(EngineArgs(model="m", device="cpu"), 0)
    with pytest.raises(ValueError, match="replica_routing must be one of prefix, least_busy; got 'random'"):
        Replicas(EngineArgs(model="m", device="cpu"), 2, routing="random")


def test_a_prompt_nobody_was_sent_goes_to_the_least_busy_replica_the_first_on_ties():
    router = PrefixRouter(PAGE, [100, 100, 100])
    assert router.choose(pages(0, 10), [3, 1, 2], [0, 1, 2]) == 1
    assert router.choose(pages(20, 30), [0, 0, 0], [0, 1, 2]) == 0
    assert router.choose(pages(40), [5, 0, 0], [0, 2]) == 2       # replica 1 is not taking requests


def test_a_prompt_goes_where_the_longest_run_of_its_first_pages_went():
    router = PrefixRouter(PAGE, [100, 100])
    assert router.choose(pages(0, 10), [0, 0], [0, 1]) == 0
    assert router.choose(pages(50), [0, 0], [0, 1]) == 0           # nothing cached: the first on ties
    assert router.choose(pages(0, 10, 20, 30), [3, 0], [0, 1]) == 0   # a conversation's next turn
    assert router.choose(pages(0, 10, 20, 31), [1, 0], [0, 1]) == 0
    # the same pages in another order share no prefix: each page's hash covers those before it
    assert router.choose(pages(10, 0), [1, 0], [0, 1]) == 1
    # a partial last page never counts, so a prompt shorter than a page is only balanced
    assert router.choose(pages(0)[:PAGE - 1], [1, 0], [0, 1]) == 1


def test_a_replica_busier_than_the_least_busy_by_more_than_the_margin_loses_its_prefix():
    router = PrefixRouter(PAGE, [100, 100])
    router.choose(pages(0, 10), [0, 0], [0, 1])
    assert router.choose(pages(0, 10, 20), [4, 0], [0, 1]) == 0    # 4 more: within max(4, 0 // 4)
    assert router.choose(pages(0, 10, 30), [5, 0], [0, 1]) == 1    # 5 more: computed again on 1
    # replica 1 holds pages(0, 10) now too; replica 0 alone holds pages(0, 10, 20)
    assert router.choose(pages(0, 10, 20, 40), [25, 20], [0, 1]) == 0   # 5 more: a quarter of 20
    assert router.choose(pages(0, 10, 20, 50), [26, 20], [0, 1]) == 1   # 6 more


def test_each_index_keeps_the_pages_its_pool_holds_the_least_recently_sent_evicted_first():
    router = PrefixRouter(PAGE, [3, 3])
    router.choose(pages(0, 10), [0, 0], [0, 1])                    # replica 0: 2 pages
    router.choose(pages(20, 30), [0, 1], [0, 1])                   # replica 0 again: 4 > 3, the oldest out
    assert router.choose(pages(0, 10), [1, 0], [0, 1]) == 1        # its first page is gone: balanced
    router2 = PrefixRouter(PAGE, [3, 3])
    router2.choose(pages(0, 10), [0, 0], [0, 1])
    router2.choose(pages(0), [0, 0], [0, 1])                       # sent again: the most recent now
    router2.choose(pages(20, 30), [0, 1], [0, 1])                  # evicts pages(0, 10)'s second page
    assert router2.choose(pages(0, 40), [1, 0], [0, 1]) == 0       # its first page is still there


def test_least_busy_routing_passes_a_conversation_s_cached_replica_over_for_a_less_busy_one():
    prefix, least_busy = make_router("prefix", True, PAGE, [100, 100]), make_router("least_busy", True, PAGE, [100, 100])
    assert isinstance(prefix, PrefixRouter) and isinstance(least_busy, LeastBusyRouter)
    for router in (prefix, least_busy):
        assert router.choose(pages(0, 10), [0, 0], [0, 1]) == 0
    assert prefix.choose(pages(0, 10, 20), [2, 0], [0, 1]) == 0         # its earlier turn's replica
    assert least_busy.choose(pages(0, 10, 20), [2, 0], [0, 1]) == 1     # the least busy
    assert least_busy.choose(pages(0, 10, 20), [2, 1], [0]) == 0        # among those taking requests
    # without prefix caching there is no cached prefix to route to
    assert isinstance(make_router("prefix", False, PAGE, [100, 100]), LeastBusyRouter)
