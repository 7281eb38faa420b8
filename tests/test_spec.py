"""Speculative decoding with the MTP layer: lossless greedy, exact sampling, pages, configuration."""

from __future__ import annotations

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend import LLM
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.spec.acceptance import draw_for_judging, judge_chains, judge_trees, judge_trees_now
from dsa_backend.spec.config import SpecConfig
from dsa_backend.spec.drafter import ChainDrafts
from dsa_backend.spec.tree import DraftTree
from test_engine import run_all

PROMPTS = random_prompts([20, 45, 70, 100, 33, 64, 90, 12], seed=31)  # five longer than index_topk 32
GREEDY = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
_plain: dict = {}


def engine(path, page_size, **spec) -> Engine:
    # page size 1 needs as many pages as tokens
    pages = 2048 if page_size == 1 else 64
    return Engine(EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=page_size,
                             num_kv_pages=pages, **spec))


def record_finished(e: Engine) -> dict:
    """Wrap e.step so that every request's final output lands in the returned dict."""
    finals = {}
    real_step = e.step

    def step():
        outs = real_step()
        finals.update({o.request_id: o for o in outs if o.finished})
        return outs

    e.step = step
    return finals


def plain_greedy(checkpoint, name):
    if name not in _plain:
        _plain[name] = run_all(engine(checkpoint(name), 64), {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS)})
    return _plain[name]


@pytest.mark.parametrize("name, steps, page_size", [
    ("deepseek_v32", 1, 64), ("deepseek_v32", 2, 1), ("deepseek_v32", 3, 64), ("deepseek_v32", 4, 1),
    ("glm_moe_dsa", 2, 64), ("glm_moe_dsa", 4, 1),
    ("glm_shared_freq", 1, 1), ("glm_shared_freq", 3, 64),
])
def test_chain_speculation_gives_exactly_the_plain_greedy_tokens(checkpoint, name, steps, page_size):
    spec = engine(checkpoint(name), page_size, speculative_algorithm="mtp", speculative_num_steps=steps)
    got = run_all(spec, {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert got == plain_greedy(checkpoint, name)
    assert spec.scheduler.pages.num_available == spec.num_kv_pages


@pytest.mark.parametrize("corrupt_last", [False, True])
def test_accepted_drafts_keep_their_kv_and_stay_lossless(checkpoint, corrupt_last, monkeypatch):
    # The random MTP layer rarely guesses right, so a drafter that knows the plain greedy
    # continuation stands in for a trained one: all drafts accepted, or all but the last. The MTP
    # layer still drafts (keeping its own KV up to date); the oracle replaces what it hands out,
    # after noting the layer's own drafts. Those start at the accepted path's last row, which a
    # verify judged on the GPU finds there, and one judged on the host here.
    expected = plain_greedy(checkpoint, "deepseek_v32")
    made = []

    def oracle_hand_to(drafts, seq, request):
        (own,) = drafts.host.wait()
        made.append((seq.request_id, own[request * 3:request * 3 + 3]))
        n = len(seq.output_ids)
        tokens = expected[seq.request_id][n:n + 3]
        if corrupt_last and len(tokens) == 3:
            tokens = tokens[:2] + [(tokens[2] + 1) % 1000]
        seq.draft = DraftTree.chain(tokens) if tokens else None

    monkeypatch.setattr(ChainDrafts, "hand_to", oracle_hand_to)
    requests = {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS)}
    own_drafts = []
    for on_gpu in (True, False):
        spec = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=3)
        if not on_gpu:
            monkeypatch.setattr(spec, "_judges_on_gpu", lambda batch: False)
        finals = record_finished(spec)
        assert run_all(spec, requests) == expected
        rate = sum(o.num_accepted_draft_tokens for o in finals.values()) / sum(
            o.num_draft_tokens for o in finals.values())
        assert (0.6 < rate < 0.7) if corrupt_last else rate == 1.0
        assert spec.scheduler.pages.num_available == spec.num_kv_pages
        own_drafts.append(made[:])
        made.clear()
    assert own_drafts[0] == own_drafts[1] and len(own_drafts[0]) > 50


def test_accepted_drafts_are_judged_with_their_path_as_output(checkpoint, monkeypatch):
    # Each verified node is sampled as if the drafts above it were already output. Here min_tokens
    # unbans the stop token exactly at output 10, where the plain greedy output has it: a node
    # judged without its path would still ban it there. Drafts are the plain continuation.
    plain = plain_greedy(checkpoint, "deepseek_v32")
    requests = {rid: (p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, min_tokens=10,
                                        stop_token_ids=[plain[rid][10]]))
                for rid, p in zip(plain, PROMPTS[:4])}
    expected = run_all(engine(checkpoint("deepseek_v32"), 16), requests)
    assert all(tokens == plain[rid][:11] for rid, tokens in expected.items())
    spec = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=3)

    def oracle_hand_to(drafts, seq, request):
        n = len(seq.output_ids)
        tokens = expected[seq.request_id][n:n + 3]
        seq.draft = DraftTree.chain(tokens) if tokens else None

    monkeypatch.setattr(ChainDrafts, "hand_to", oracle_hand_to)
    assert run_all(spec, requests) == expected


def test_llm_api_reports_the_same_text_with_speculation(checkpoint):
    path = checkpoint("glm_moe_dsa")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain = LLM(path, device="cpu", dtype="float32").generate(["Hello", "你好，世界 🎉"], params)
    spec = LLM(path, device="cpu", dtype="float32", speculative_algorithm="mtp",
               speculative_num_steps=2).generate(["Hello", "你好，世界 🎉"], params)
    assert [o.text for o in spec] == [o.text for o in plain]


@pytest.mark.parametrize("on_gpu", [True, False])
def test_speculation_reports_the_plain_logprobs(checkpoint, on_gpu, monkeypatch):
    # Each emitted token's log-probability under its own target row, whether the verify was
    # judged on the GPU (greedy chains) or on the host (the path sampled requests take).
    path = checkpoint("deepseek_v32")
    prompts = [PROMPTS[0], PROMPTS[3]]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=True)
    plain = LLM(path, device="cpu", dtype="float32").generate(prompts, params)
    llm = LLM(path, device="cpu", dtype="float32", speculative_algorithm="mtp", speculative_num_steps=2)
    if not on_gpu:
        monkeypatch.setattr(llm.engine, "_judges_on_gpu", lambda batch: False)
    spec = llm.generate(prompts, params)
    for s, p in zip(spec, plain):
        assert s.token_ids == p.token_ids and len(s.logprobs) == 20
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-4)
        assert s.cumulative_logprob == pytest.approx(p.cumulative_logprob, abs=1e-3)


def test_acceptance_counts_are_reported(checkpoint):
    e = engine(checkpoint("deepseek_v32"), 64, speculative_algorithm="mtp", speculative_num_steps=2)
    e.add_request("a", PROMPTS[0], GREEDY)
    outs = []
    while e.has_work():
        outs += e.step()
    last = outs[-1]
    assert last.num_draft_tokens > 0 and 0 <= last.num_accepted_draft_tokens <= last.num_draft_tokens
    # every step emits accepted drafts plus one target token
    assert sum(len(o.new_token_ids) for o in outs) == 64


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_rejection_sampling_emits_the_target_distribution():
    # p0 is the target at the first drafted position, p1 at the second; the draft proposes token 2
    # then token 0. Whatever the drafts, the first emitted token must follow p0 and, when the first
    # draft was accepted, the second must follow p1 (20000 copies judged at once by judge_trees).
    # Threshold: chi-square with 5 degrees of freedom at significance 0.001 is 20.5.
    p0 = torch.tensor([0.05, 0.25, 0.30, 0.0, 0.15, 0.25])
    p1 = torch.tensor([0.40, 0.10, 0.10, 0.20, 0.0, 0.20])
    probs = torch.stack([p0, p1, torch.full((6,), 1 / 6)])
    gen = torch.Generator().manual_seed(0)
    first, second = torch.zeros(6), torch.zeros(6)
    for _, out in judge_trees_now(probs, [DraftTree.chain([2, 0])] * 20000, [0] * 20000, [None] * 20000, gen):
        first[out[0]] += 1
        if out[0] == 2:
            second[out[1]] += 1
    assert chi_square(first, p0) < 20.5
    assert chi_square(second, p1) < 20.5


def test_chains_judged_on_the_device_emit_the_target_distribution():
    # judge_chains over 20000 copies of the chain above at once, with a third draft (token 1,
    # judged under p2): the token at each depth follows its row, whatever the drafts; and
    # judge_trees, given the same draws, reaches the same verdicts on the same chains.
    p2 = torch.tensor([0.10, 0.30, 0.20, 0.20, 0.10, 0.10])
    probs = torch.stack([torch.tensor([0.05, 0.25, 0.30, 0.0, 0.15, 0.25]),
                         torch.tensor([0.40, 0.10, 0.10, 0.20, 0.0, 0.20]), p2, torch.full((6,), 1 / 6)])
    n = 20000
    gen = torch.Generator().manual_seed(0)
    drafts = torch.tensor([[2, 0, 1]]).expand(n, 3)
    uniforms, races = draw_for_judging(n, (3,), 6, [None] * n, gen, torch.device("cpu"))
    accepted, tokens = judge_chains(probs.expand(n, 4, 6), drafts, uniforms, races)
    assert chi_square(torch.bincount(tokens[:, 0], minlength=6).float(), probs[0]) < 20.5
    second = tokens[accepted >= 1, 1]
    assert chi_square(torch.bincount(second, minlength=6).float(), probs[1]) < 20.5
    third = tokens[accepted >= 2, 2]
    assert chi_square(torch.bincount(third, minlength=6).float(), p2) < 20.5
    # emitted tokens are the kept drafts, then one more; the kept count follows the drafts' odds
    assert all((tokens[accepted > j, j] == d).all() for j, d in enumerate([2, 0, 1]))
    assert abs((accepted >= 1).float().mean() - 0.30) < 0.02
    assert abs((accepted >= 2).float().mean() - 0.30 * 0.40) < 0.02
    children = torch.tensor([[1], [2], [3], [-1]]).expand(n, 4, 1)
    path, token = judge_trees(probs.expand(n, 4, 6), children, torch.tensor([0, 2, 0, 1]).expand(n, 4),
                              uniforms.view(n, 3, 1), races)
    assert torch.equal((path >= 0).sum(dim=1), accepted)
    assert torch.equal(token, tokens.gather(1, accepted.unsqueeze(1)).squeeze(1))


def test_greedy_target_accepts_exactly_the_matching_prefix():
    one_hot = torch.eye(5)[[3, 1, 4]]  # the target's argmax is 3, then 1, then 4
    for drafts, verdict in [([3, 1], ([1, 2], [3, 1, 4])), ([3, 2], ([1], [3, 1])), ([0, 1], ([], [3]))]:
        assert judge_trees_now(one_hot, [DraftTree.chain(drafts)], [0], [None], None) == [verdict]


def test_seeded_sampling_with_speculation_is_reproducible(checkpoint):
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True)
    runs = [run_all(engine(checkpoint("glm_moe_dsa"), 64, speculative_algorithm="mtp", speculative_num_steps=3),
                    {"a": (PROMPTS[1], params)}) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]["a"]) == 16


def test_a_seeded_request_samples_the_same_tokens_whichever_way_its_chains_are_judged(checkpoint, monkeypatch):
    # Alone, every verify of a seeded sampled request is judged on the GPU path; with that path
    # off, on the host. Both draw its randomness the same way, so its tokens are the same.
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    runs = []
    for on_gpu in (True, False):
        e = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=2)
        if not on_gpu:
            monkeypatch.setattr(e, "_judges_on_gpu", lambda batch: False)
        runs.append(run_all(e, {"a": (PROMPTS[2], params)})["a"])
    assert runs[0] == runs[1] and len(runs[0]) == 24


@pytest.mark.parametrize("spec", [dict(speculative_algorithm="mtp", speculative_num_steps=2),
                                  dict(speculative_algorithm="eagle", speculative_num_steps=2, speculative_eagle_topk=2)],
                         ids=["chain", "tree"])
def test_a_seeded_request_samples_the_same_tokens_alone_and_beside_other_requests(checkpoint, spec):
    # Beside others its first token is judged among their verifies (or prefills), whose trees
    # are deeper than its own: it still draws only its own tree's uniforms, so its numbers, and
    # its tokens, are those it gets alone. With no drafts it draws none, as plain sampling.
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    alone = run_all(engine(checkpoint("deepseek_v32"), 16, **spec), {"s": (PROMPTS[2], params)})["s"]
    # sampled too, so that they are judged with it (greedy ones are judged apart, on the host)
    others = {f"o{i}": (PROMPTS[i], SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)) for i in (0, 4, 7)}
    e = engine(checkpoint("deepseek_v32"), 16, **spec)
    for rid, (prompt, p) in others.items():
        e.add_request(rid, prompt, p)
    e.step()                                        # the others' first tokens and drafts
    e.add_request("s", PROMPTS[2], params)
    beside = []
    while e.has_work():
        beside += [t for out in e.step() if out.request_id == "s" for t in out.new_token_ids]
    assert beside == alone and len(alone) == 12
    plain = run_all(engine(checkpoint("deepseek_v32"), 16), {"s": (PROMPTS[2], params)})["s"]
    assert alone[0] == plain[0]


def test_cancelling_mid_speculation_frees_every_page_drafts_included(checkpoint):
    e = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=4)
    e.add_request("a", PROMPTS[3], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    for _ in range(4):
        e.step()
    seq = e.sequences["a"]
    assert seq.draft and seq.num_draft_tokens > 0
    e.abort("a")
    assert e.scheduler.pages.num_available == e.num_kv_pages


@pytest.mark.parametrize("spec, message", [
    (dict(num_steps=0), "speculative_num_steps"),
    (dict(num_steps=2, num_draft_tokens=5), "speculative_num_draft_tokens"),
    (dict(algorithm="medusa"), "speculative_algorithm"),
])
def test_invalid_speculative_settings_are_refused_naming_them(spec, message):
    with pytest.raises(ValueError, match=message):
        SpecConfig(**spec)


def test_speculation_needs_an_mtp_layer(tmp_path):
    from dsa_backend.tools.make_checkpoint import make_config, write_checkpoint

    cfg = make_config("deepseek_v32", "tiny")
    cfg["num_nextn_predict_layers"] = 0
    write_checkpoint(cfg, tmp_path / "c")
    with pytest.raises(ValueError, match="num_nextn_predict_layers is 0"):
        Engine(EngineArgs(model=str(tmp_path / "c"), device="cpu", speculative_algorithm="mtp"))


def test_verify_metadata_can_be_rebound_as_a_graph_replay_would():
    # Seed 003: SGLang kept the metadata that CUDA-graph replay updates in a frozen dataclass, and
    # MTP on DSA hung when the replay assigned to it.
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[5, 6, 7]], [4], [[0]], 64, "cpu", all_logits=True)
    batch.seq_lens = batch.seq_lens + 3
    batch.positions = batch.positions + 3
    assert batch.seq_lens.tolist() == [10] and batch.positions.tolist() == [7, 8, 9]


@pytest.mark.parametrize("name, spec", [
    ("deepseek_v32", dict(speculative_algorithm="mtp", speculative_num_steps=3)),
    ("glm_moe_dsa", dict(speculative_algorithm="eagle", speculative_num_steps=2, speculative_eagle_topk=3)),
])
def test_speculation_over_cached_prefixes_gives_the_plain_greedy_tokens(checkpoint, name, spec):
    # The MTP layer's KV at a cached prefix's last position was made with the next token of the
    # request that cached it: drafts may differ, the verified tokens may not.
    system, *tails = random_prompts([70, 5, 30, 12], seed=32)
    waves = [{"a": system + tails[0]}, {"b": system + tails[1], "c": system + tails[2], "d": system + tails[0]}]
    path = checkpoint(name)
    want = run_all(engine(path, 16, enable_prefix_caching=False),
                   {k: (p, GREEDY) for wave in waves for k, p in wave.items()})
    e = engine(path, 16, **spec)
    got = {}
    for wave in waves:
        got |= run_all(e, {k: (p, GREEDY) for k, p in wave.items()})
    assert got == want
    assert e.stats()["prefix_cache_hit_tokens"] == 3 * 64
    assert e.scheduler.pages.num_available == e.num_kv_pages
