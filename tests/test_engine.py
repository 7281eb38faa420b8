"""The Engine on the tiny checkpoint: batching, retraction, sampling, abort, prefix caching."""

from __future__ import annotations

import itertools

import pytest

from checkpoints import random_prompts
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def run_all(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens = {rid: [] for rid in requests}
    done = set()
    while len(done) < len(requests):
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                done.add(out.request_id)
    return tokens


@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("glm_moe_dsa")


def make_engine(path, **kw) -> Engine:
    return Engine(EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=16, **kw))


def test_greedy_is_batch_invariant_alone_or_among_32_others(path):
    prompts = random_prompts([5 + 3 * i for i in range(33)], seed=21)
    engine = make_engine(path)
    alone = run_all(engine, {"solo": (prompts[0], GREEDY)})["solo"]
    together = run_all(engine, {f"r{i}": (p, GREEDY) for i, p in enumerate(prompts)})
    assert together["r0"] == alone


def test_tiny_kv_pool_retracts_and_still_completes_every_request_correctly(path):
    prompts = random_prompts([30, 40, 35, 45, 38, 33], seed=22)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = run_all(make_engine(path), {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    small = make_engine(path, num_kv_pages=6)  # 96 slots for ~6 x 60 tokens of demand
    got = run_all(small, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    assert got == expected
    assert small.scheduler.num_retractions > 0
    assert small.scheduler.pages.num_available == 6


def test_same_seed_gives_the_same_sample_whatever_else_runs(path):
    prompt = random_prompts([12], seed=23)[0]
    seeded = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    engine = make_engine(path)
    alone = run_all(engine, {"a": (prompt, seeded)})["a"]
    others = {f"o{i}": (p, SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True))
              for i, p in enumerate(random_prompts([7, 9, 11], seed=24))}
    mixed = run_all(engine, {"b": (prompt, seeded), **others})["b"]
    assert mixed == alone


def test_stop_token_ids_and_max_tokens_finish_requests(path):
    engine = make_engine(path)
    prompt = random_prompts([10], seed=25)[0]
    first = run_all(engine, {"a": (prompt, GREEDY)})["a"]
    stop = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, stop_token_ids=[first[2]])
    engine.add_request("b", prompt, stop)
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert [t for o in outs for t in o.new_token_ids] == first[:3]
    assert outs[-1].finish_reason == "stop" and outs[-1].finished


@pytest.mark.parametrize("prompt_len, max_tokens, field", [
    (0, 4, "prompt is empty"), (5000, 4, "max_model_len"), (10, 5000, "max_tokens"),
])
def test_requests_that_can_never_fit_are_refused_naming_the_problem(path, prompt_len, max_tokens, field):
    engine = make_engine(path)
    with pytest.raises(ValueError, match=field):
        engine.add_request("x", [5] * prompt_len, SamplingParams(max_tokens=max_tokens))


def test_abort_mid_generation_frees_every_page(path):
    engine = make_engine(path, num_kv_pages=16)
    engine.add_request("a", random_prompts([40], seed=26)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.scheduler.pages.num_available < 16
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert engine.scheduler.pages.num_available == 16 and not engine.has_work()


def test_logprobs_are_reported_and_summed(path):
    engine = make_engine(path)
    engine.add_request("a", random_prompts([8])[0], SamplingParams(max_tokens=3, temperature=0, logprobs=True,
                                                                      ignore_eos=True))
    outs = []
    while engine.has_work():
        outs += engine.step()
    logprobs = [lp for o in outs for lp in o.new_logprobs]
    assert len(logprobs) == 3 and all(lp <= 0 for lp in logprobs)
    assert outs[-1].cumulative_logprob == pytest.approx(sum(logprobs))


def shared_prefix_requests(prefix_len: int, tails: list[int], seed: int) -> dict[str, list[int]]:
    system, *rest = random_prompts([prefix_len, *tails], seed=seed)
    return {f"t{i}": system + tail for i, tail in enumerate(rest)}


def test_each_output_reports_the_prompt_tokens_found_in_the_cache(path):
    prompts = shared_prefix_requests(40, [3, 9], seed=33)
    engine = make_engine(path)
    run_all(engine, {"first": (prompts["t0"], GREEDY)})
    engine.add_request("second", prompts["t1"], GREEDY)
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert {o.num_cached_tokens for o in outs} == {32}            # the system prompt's two pages of 16


def test_prefix_cache_hits_give_the_tokens_of_a_full_prefill(path):
    first = shared_prefix_requests(40, [3, 9, 17], seed=28)          # pages of 16: two shared, 32 tokens
    second = {**shared_prefix_requests(40, [5, 11], seed=28), "again": first["t1"]}
    second = {f"s{k}": p for k, p in second.items()}
    want = run_all(make_engine(path, enable_prefix_caching=False),
                   {k: (p, GREEDY) for k, p in {**first, **second}.items()})
    engine = make_engine(path)
    got = run_all(engine, {k: (p, GREEDY) for k, p in first.items()})
    # t1 and t2 wait a step for t0 to compute the system prompt's pages, then find them
    assert engine.stats()["prefix_cache_hit_tokens"] == 32 + 32
    got |= run_all(engine, {k: (p, GREEDY) for k, p in second.items()})
    assert got == want
    # the two new tails find the system prompt's two pages; the repeat finds its own three
    assert engine.stats()["prefix_cache_hit_tokens"] == 64 + 32 + 32 + 48
    assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]


def test_a_request_sharing_cached_pages_is_untouched_by_its_neighbours_abort(path):
    prompts = shared_prefix_requests(48, [4, 6], seed=29)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = run_all(make_engine(path, enable_prefix_caching=False), {"t1": (prompts["t1"], params)})
    engine = make_engine(path)
    run_all(engine, {"warm": (prompts["t0"], GREEDY)})               # caches the shared pages
    engine.add_request("a", prompts["t0"], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", prompts["t1"], params)
    tokens = []
    for step in range(20):
        if step == 3:
            engine.abort("a")
        tokens += [t for out in engine.step() if out.request_id == "b" for t in out.new_token_ids]
    assert tokens == alone["t1"] and not engine.has_work()
    assert engine.stats()["prefix_cache_hit_tokens"] == 48 + 48


def test_a_tight_pool_evicts_cached_pages_and_every_request_still_completes_correctly(path):
    prompts = {**shared_prefix_requests(32, [20, 30, 25], seed=30), **shared_prefix_requests(20, [28, 35], seed=31)}
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = run_all(make_engine(path, enable_prefix_caching=False),
                       {f"{k}{j}": (p, params) for j in range(2) for k, p in prompts.items()})
    small = make_engine(path, num_kv_pages=8)
    got = {}
    for j in range(2):  # the second round finds what the first left, as far as eviction allowed
        got |= run_all(small, {f"{k}{j}": (p, params) for k, p in prompts.items()})
    assert got == expected
    stats = small.stats()
    assert stats["prefix_cache_hit_tokens"] > 0 and stats["kv_pages_free"] == 8
    assert small.scheduler.pages.num_cached <= 8


def test_priorities_order_the_requests_and_an_urgent_one_retracts_a_running_one(path):
    prompts = random_prompts([20, 24, 28, 18], seed=24)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = run_all(make_engine(path), {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    engine = make_engine(path, max_running_requests=2)
    for i, priority in enumerate((3, 3, 1)):
        engine.add_request(f"r{i}", prompts[i], params, priority)
    tokens, finished = {f"r{i}": [] for i in range(4)}, []
    for step in itertools.count():
        if step == 3:   # r2 (priority 1) and r0 run; r3 outranks both and retracts r0, the lower of the two
            engine.add_request("r3", prompts[3], params, priority=0)
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                finished.append(out.request_id)
        if len(finished) == 4:
            break
    assert finished[:2] == ["r2", "r3"] and engine.scheduler.num_retractions == 1
    assert tokens == expected      # the retracted request computes its output again, unchanged


def test_a_logit_bias_steers_every_step_and_the_request_without_it_is_unchanged(path):
    prompts = random_prompts([12, 12], seed=25)
    plain = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    steered = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logit_bias={4242: 100})
    expected = run_all(make_engine(path), {"plain": (prompts[1], plain)})
    got = run_all(make_engine(path), {"steered": (prompts[0], steered), "plain": (prompts[1], plain)})
    assert got["steered"] == [4242] * 6 and got["plain"] == expected["plain"]
