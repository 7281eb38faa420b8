"""Overlap scheduling (EngineArgs.overlap_schedule): step n + 1 is scheduled and launched before
step n's tokens are read back. It must give exactly the tokens, logprobs and finish reasons of the
engine that reads each step back at once, free every page, and never compute past a request's end."""

from __future__ import annotations

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend.engine import Engine, EngineArgs, RequestOutput
from dsa_backend.sampling_params import SamplingParams


@pytest.fixture(scope="module", params=["glm_moe_dsa", "deepseek_v32"])
def path(request, checkpoint):
    return checkpoint(request.param)


def make_engine(path, overlap: bool, device: str = "cpu", **kw) -> Engine:
    dtype = "float32" if device == "cpu" else "auto"
    return Engine(EngineArgs(model=str(path), device=device, dtype=dtype, page_size=16, overlap_schedule=overlap, **kw))


def run_all(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    outs: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    while engine.has_work():
        for out in engine.step():
            assert not outs[out.request_id] or not outs[out.request_id][-1].finished, "output after the last"
            outs[out.request_id].append(out)
    assert all(o and o[-1].finished for o in outs.values())
    return outs


def summary(outs: dict[str, list[RequestOutput]]) -> dict[str, tuple]:
    return {rid: ([t for o in steps for t in o.new_token_ids], steps[-1].finish_reason, steps[-1].num_output_tokens)
            for rid, steps in outs.items()}


def mixed_requests(stop_token: int | None = None) -> dict[str, tuple[list[int], SamplingParams]]:
    """Prompts longer than a step's token budget (chunked prefill) beside short ones; greedy,
    seeded and logprob requests; lengths ending on different steps."""
    prompts = random_prompts([5, 70, 12, 33, 9, 51], seed=41)
    params = [SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=True),
              SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True, logprobs=True),
              SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=1.0, top_k=50, seed=8, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                             stop_token_ids=[stop_token] if stop_token is not None else [])]
    return {f"r{i}": (p, sp) for i, (p, sp) in enumerate(zip(prompts, params))}


def test_overlapped_steps_give_the_tokens_logprobs_and_finishes_of_steps_read_back_at_once(path):
    sync = run_all(make_engine(path, False, max_num_batched_tokens=32), mixed_requests())
    # r5's fourth token becomes its stop token: it stops while its next step is already launched
    stop = summary(sync)["r5"][0][3]
    sync = run_all(make_engine(path, False, max_num_batched_tokens=32), mixed_requests(stop))
    engine = make_engine(path, True, max_num_batched_tokens=32)
    overlapped = run_all(engine, mixed_requests(stop))
    assert summary(overlapped) == summary(sync)
    assert summary(sync)["r5"][1] == "stop" and len(summary(sync)["r5"][0]) <= 4
    for rid in ("r1", "r2"):
        got = [lp for o in overlapped[rid] for lp in o.new_logprobs]
        want = [lp for o in sync[rid] for lp in o.new_logprobs]
        assert got == pytest.approx(want, abs=1e-5)
    assert engine.scheduler.pages.num_available == engine.num_kv_pages and not engine.sequences


def test_requests_whose_sampling_reads_the_output_see_every_token_before_it(path):
    prompts = random_prompts([14, 9, 20, 11], seed=42)
    plain = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    greedy = summary(run_all(make_engine(path, False), {"g": (prompts[0], plain)}))["g"][0]
    # A two-token bad word bans greedy's fourth token only where the context ends with its third
    # (such a request reads the last step back before the next one); min_tokens 3 lifts the ban
    # on a stop token exactly where greedy's fourth token comes, counting the token not read back.
    banned = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, bad_words_ids=[greedy[2:4]])
    unbanned_at_3 = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, min_tokens=3,
                                   stop_token_ids=[greedy[3]])
    overlapped = {"min_tokens": (prompts[0], unbanned_at_3),
                  "penalized": (prompts[1], SamplingParams(max_tokens=10, temperature=0, repetition_penalty=1.3,
                                                           frequency_penalty=0.5, ignore_eos=True)),
                  "plain": (prompts[2], plain)}
    read_first = {"banned": (prompts[0], banned), "plain": (prompts[3], plain)}
    for requests in (overlapped, read_first):
        want = summary(run_all(make_engine(path, False), requests))
        assert summary(run_all(make_engine(path, True), requests)) == want
        if "banned" in want:
            assert want["banned"][0][:3] == greedy[:3] and want["banned"][0][3] != greedy[3]
        else:
            assert want["min_tokens"] == (greedy[:4], "stop", 4)


def test_a_request_whose_last_token_is_sampled_is_not_computed_again(path):
    engine = make_engine(path, True)
    prompt = random_prompts([20], seed=43)[0]
    engine.add_request("a", prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    seq = engine.sequences["a"]
    outs = []
    while engine.has_work():
        outs += engine.step()
    # positions 0 .. prompt + 1 computed: the third token is sampled, never fed back
    assert seq.num_computed == len(prompt) + 2 and len(seq.output_ids) == 3 and not seq.pending_rows
    assert [o.num_output_tokens for o in outs] == [1, 2, 3] and outs[-1].finish_reason == "length"


def test_abort_with_a_token_still_unread_frees_every_page_and_reports_only_read_tokens(path):
    engine = make_engine(path, True, num_kv_pages=16)
    engine.add_request("a", random_prompts([40], seed=44)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    emitted = sum(len(o.new_token_ids) for _ in range(4) for o in engine.step())
    assert engine.sequences["a"].pending_rows  # the fourth step's token is still on its way
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort" and out.num_output_tokens == emitted == 3
    assert engine.scheduler.pages.num_available == 16 and not engine.has_work()
    assert engine.step() == []  # the unread token of an ended request is dropped


def test_a_tiny_pool_retracts_and_overlapped_requests_still_complete_exactly(path):
    prompts = random_prompts([30, 40, 35, 45, 38, 33], seed=45)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    requests = {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    engine = make_engine(path, True, num_kv_pages=6)  # 96 slots for ~6 x 60 tokens of demand
    got = summary(run_all(engine, requests))
    assert got == summary(run_all(make_engine(path, False), requests))
    assert engine.scheduler.num_retractions > 0 and engine.scheduler.pages.num_available == 6


@pytest.mark.gpu
def test_overlapped_decode_steps_return_while_the_gpu_runs_and_never_synchronize(checkpoint):
    """On the GPU a step returns with its forward still queued, and nothing in it waits for the
    GPU but the read back of the step before (an event), under torch's sync debug mode."""
    path = checkpoint("deepseek_v32")
    prompts = random_prompts([300 + 7 * i for i in range(8)], seed=46)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    requests = {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    want = summary(run_all(make_engine(path, False, device="cuda", num_kv_pages=256), requests))
    engine = make_engine(path, True, device="cuda", num_kv_pages=256)
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    outs = {rid: [] for rid in requests}
    busy = decode_steps = 0
    while engine.has_work():
        decoding = all(s.num_computed >= len(s.prompt_ids) for s in engine.sequences.values())
        # past the first decode steps, which capture the batch's graph (a capture synchronizes)
        torch.cuda.set_sync_debug_mode("error" if decoding and decode_steps >= 2 else "default")
        try:
            step = engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if decoding and engine.sequences:
            decode_steps += 1
            busy += not torch.cuda.current_stream().query()
        for out in step:
            outs[out.request_id].append(out)
    assert summary(outs) == want
    assert decode_steps >= 30 and busy >= decode_steps // 2, (busy, decode_steps)
