"""Guided decoding (structured output): guides, their bitmasks, and engines whose outputs match
them with and without overlap scheduling, speculative chains and trees."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.guided import Grammars, Guide, allowed_tokens
from dsa_backend.sampling import SamplingBatch, SamplingRow, process_logits
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.tokenizer import Tokenizer
from dsa_backend.transfer import HostCopy
from test_engine import run_all
from dsa_backend.spec.drafter import ChainDrafts
from dsa_backend.spec.tree import DraftTree
from test_spec import record_finished
from test_spec_tree import with_oracle_trees

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "ok", "color"],
          "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "ok": {"type": "boolean"},
                         "color": {"type": "string", "pattern": "^[a-z]{2,8}$"}}}
EMAIL = r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)"
PROMPTS = random_prompts([9, 30, 50, 17], seed=5)


def guided(max_tokens=48, temperature=0.0, **guide) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7 if temperature else None,
                          guided_decoding=guide)


def make_engine(path, **kw) -> Engine:
    return Engine(EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=16, **{"num_kv_pages": 128, **kw}))


def texts(tokenizer: Tokenizer, tokens: dict[str, list[int]]) -> dict[str, str]:
    return {rid: tokenizer.decode(ids) for rid, ids in tokens.items()}


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"answer", "ok", "color"}
    assert value["answer"] in ("yes", "no", "maybe") and isinstance(value["ok"], bool)
    assert re.fullmatch("[a-z]{2,8}", value["color"])


# --- guides ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"json": SCHEMA, "regex": "a"}, "exactly one of"),
    ({"jsn": SCHEMA}, "exactly one of"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", 3]}, "non-empty list"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"regex": ""}, "non-empty string"),
    ("a regex", "must be a JSON object"),
])
def test_a_bad_guide_is_refused_where_it_enters_naming_the_problem(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(guided_decoding=fields)


def test_a_guide_type_outside_the_known_ones_is_refused():
    with pytest.raises(ValueError, match="json, json_schema, regex, ebnf_grammar, choice"):
        Guide("structural_tag", "{}")


def test_min_tokens_and_ignore_eos_cannot_be_combined_with_a_guide():
    for extra in ({"min_tokens": 2}, {"ignore_eos": True}):
        with pytest.raises(ValueError, match="the guide decides where the output ends"):
            SamplingParams(max_tokens=8, guided_decoding={"regex": "a+"}, **extra)


def test_vllm_guided_decoding_objects_become_guides():
    assert SamplingParams(guided_decoding={"json": SCHEMA}).guided_decoding == Guide("json_schema", json.dumps(SCHEMA))
    assert SamplingParams(guided_decoding={"json_object": True}).guided_decoding == Guide("json")
    assert (SamplingParams(guided_decoding={"choice": ["a", "b"], "disable_any_whitespace": True}).guided_decoding
            == Guide("choice", '["a", "b"]', any_whitespace=False))


# --- bitmasks -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("glm_moe_dsa")


@pytest.fixture(scope="module")
def tokenizer(path):
    return Tokenizer(path)


@pytest.fixture(scope="module")
def grammars(path):
    from dsa_backend.config import ModelConfig
    return Grammars(str(path), ModelConfig.from_pretrained(path).vocab_size)


def allowed_ids(bitmask: torch.Tensor, row: int, vocab: int) -> set[int]:
    return set(allowed_tokens(bitmask, vocab)[row].nonzero().flatten().tolist())


def test_bitmask_rows_allow_what_the_grammar_allows_next_and_leave_the_matcher_where_it_was(grammars, tokenizer):
    vocab, eos = grammars.vocab_size, tokenizer.eos_token_id
    matcher = grammars.matcher(Guide("choice", '["yes", "no"]'), {eos})
    yes = tokenizer.encode("yes", add_bos=False)
    assert len(yes) == 1
    wrong = tokenizer.encode("maybe", add_bos=False)[:1]
    bitmask = grammars.token_bitmask([None, (matcher, ()), (matcher, yes), (matcher, wrong), (matcher, [vocab - 1])])
    assert allowed_ids(bitmask, 0, vocab) == set(range(vocab))            # unguided
    start = allowed_ids(bitmask, 1, vocab)
    assert yes[0] in start and wrong[0] not in start and eos not in start
    assert all(tokenizer.decode([t]) and ("yes".startswith(tokenizer.decode([t]))
                                          or "no".startswith(tokenizer.decode([t]))) for t in start)
    assert allowed_ids(bitmask, 2, vocab) == {eos}                        # after "yes" only the end
    assert allowed_ids(bitmask, 3, vocab) == set(range(vocab))            # a path the grammar refuses
    assert allowed_ids(bitmask, 4, vocab) == set(range(vocab))            # a padding id past the tokenizer's
    again = grammars.token_bitmask([(matcher, ())])                         # the paths were rolled back
    assert allowed_ids(again, 0, vocab) == start


def test_allowed_tokens_unpacks_bit_t_mod_32_of_word_t_div_32():
    vocab = 70
    want = torch.rand(3, vocab) < 0.5
    words = torch.zeros(3, 3, dtype=torch.int64)
    for row, t in want.nonzero().tolist():
        words[row, t // 32] |= 1 << (t % 32)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    assert torch.equal(allowed_tokens(packed, vocab), want)


def test_the_sampler_sets_every_token_a_guide_refuses_to_minus_inf_on_guided_rows_only():
    vocab = 40
    bitmask = torch.full((2, 2), -1, dtype=torch.int32)
    bitmask[1] = torch.tensor([0b1010, 0], dtype=torch.int32)              # tokens 1 and 3
    rows = [SamplingRow(SamplingParams(temperature=0), [1], []) for _ in range(2)]
    batch = SamplingBatch.build(rows, vocab, [0], "cpu", token_bitmask=bitmask)
    logits = torch.randn(2, vocab)
    out = process_logits(logits, batch)
    assert torch.equal(out[0], logits[0])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [1, 3]


# --- engines --------------------------------------------------------------------------------

def test_greedy_and_sampled_outputs_match_their_guides_and_stop_at_the_grammars_end(path, tokenizer):
    engine = make_engine(path)
    finals = record_finished(engine)
    requests = {
        "schema": (PROMPTS[0], guided(json=SCHEMA, disable_any_whitespace=True)),
        "email": (PROMPTS[1], guided(temperature=1.0, regex=EMAIL)),
        "choice": (PROMPTS[2], guided(temperature=1.0, choice=["red", "green", 'say "hi"\n'])),
        "ebnf": (PROMPTS[3], guided(grammar='root ::= "(" [0-9]+ ("," [0-9]+)* ")"', max_tokens=8)),
    }
    got = texts(tokenizer, run_all(engine, requests))
    check_schema(got["schema"])
    assert re.fullmatch(EMAIL, got["email"])
    assert got["choice"] in ("red", "green", 'say "hi"\n')
    for rid in ("schema", "email", "choice"):
        assert finals[rid].finish_reason == "stop"
    # a grammar cut off by max_tokens: a prefix of a match, finish_reason length
    assert re.fullmatch(r"\([0-9,]*", got["ebnf"]) and finals["ebnf"].finish_reason == "length"
    assert engine.scheduler.pages.num_available == engine.num_kv_pages


def test_unguided_requests_beside_guided_ones_get_their_own_tokens(path):
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = run_all(make_engine(path), {"a": (PROMPTS[0], plain), "b": (PROMPTS[2], plain)})
    mixed = run_all(make_engine(path), {"a": (PROMPTS[0], plain), "g": (PROMPTS[1], guided(regex=EMAIL)),
                                        "b": (PROMPTS[2], plain)})
    assert {k: mixed[k] for k in alone} == alone


@pytest.mark.parametrize("engine_args", [
    dict(overlap_schedule=False),
    dict(speculative_algorithm="mtp", speculative_num_steps=3),
    dict(speculative_algorithm="eagle", speculative_num_steps=2, speculative_eagle_topk=3),
], ids=["no-overlap", "mtp-chain", "eagle-tree"])
@pytest.mark.parametrize("name", ["glm_moe_dsa", "deepseek_v32"])
def test_guided_tokens_are_the_same_with_overlap_off_and_under_speculation(checkpoint, name, engine_args):
    requests = {"schema": (PROMPTS[0], guided(json=SCHEMA, disable_any_whitespace=True)),
                "email": (PROMPTS[1], guided(regex=EMAIL)),
                "words": (PROMPTS[2], guided(regex="[a-z]+( [a-z]+){5,9}", max_tokens=40))}
    overlapped = run_all(make_engine(checkpoint(name)), requests)
    other = make_engine(checkpoint(name), **engine_args)
    assert run_all(other, requests) == overlapped
    assert other.scheduler.pages.num_available == other.num_kv_pages


GUIDED = {"schema": (PROMPTS[0], guided(json=SCHEMA, disable_any_whitespace=True)),
          "words": (PROMPTS[2], guided(regex="[a-z]+( [a-z]+){5,9}", max_tokens=40))}


@pytest.mark.parametrize("judged_on_gpu", [True, False])
def test_chain_drafts_that_follow_the_guided_output_are_all_accepted(path, monkeypatch, judged_on_gpu):
    # The random MTP layer's drafts break the guide at once; an oracle drafting the plain guided
    # greedy continuation makes every verify row past the first one see a guided path.
    expected = run_all(make_engine(path), GUIDED)

    def oracle_hand_to(drafts, seq, request):
        n = len(seq.output_ids)
        tokens = expected[seq.request_id][n:n + 3]
        seq.draft = DraftTree.chain(tokens) if tokens else None

    monkeypatch.setattr(ChainDrafts, "hand_to", oracle_hand_to)
    spec = make_engine(path, speculative_algorithm="mtp", speculative_num_steps=3)
    if not judged_on_gpu:
        monkeypatch.setattr(spec, "_judges_on_gpu", lambda batch: False)
    finals = record_finished(spec)
    assert run_all(spec, GUIDED) == expected
    assert all(o.num_accepted_draft_tokens == o.num_draft_tokens > 0 for o in finals.values())


def test_tree_drafts_around_the_guided_output_accept_its_path_and_refuse_the_decoys(path):
    expected = run_all(make_engine(path), GUIDED)
    spec = make_engine(path, speculative_algorithm="eagle", speculative_num_steps=3, speculative_eagle_topk=3)
    offered = with_oracle_trees(spec, expected)
    finals = record_finished(spec)
    assert run_all(spec, GUIDED) == expected
    assert {rid: o.num_accepted_draft_tokens for rid, o in finals.items()} == offered


def test_an_overlapped_guided_step_launches_its_forward_before_it_reads_the_last_tokens_back(path, monkeypatch):
    engine = make_engine(path)
    assert engine.overlap
    events = []
    model_call, wait = type(engine.model).__call__, HostCopy.wait
    monkeypatch.setattr(type(engine.model), "__call__", lambda m, *a: (events.append("forward"), model_call(m, *a))[1])
    monkeypatch.setattr(HostCopy, "wait", lambda copy: (events.append("read"), wait(copy))[1])
    engine.add_request("g", PROMPTS[0], guided(regex="[a-z]{40}"))
    while engine.has_work():
        events.append("step")
        engine.step()
    steps = " ".join(events).split("step")
    assert sum(s.split() == ["forward", "read"] for s in steps) >= 5
    assert not any(s.split() == ["read", "forward"] for s in steps)


def test_retracted_guided_requests_resume_where_their_grammar_stood(path, tokenizer):
    # A pool of 6 pages of 16 for six ~35-token prompts growing past 55: retractions recompute the
    # prompt and the output so far, and the matcher, which followed the output, is left as it was.
    prompts = random_prompts([30, 40, 35, 45, 38, 33], seed=45)
    requests = {f"r{i}": (p, guided(max_tokens=24, regex="[a-z]+( [a-z]+)*")) for i, p in enumerate(prompts)}
    small = make_engine(path, num_kv_pages=6)
    got = run_all(small, requests)
    assert small.scheduler.num_retractions > 0 and small.scheduler.pages.num_available == 6
    assert got == run_all(make_engine(path), requests)
    for text in texts(tokenizer, got).values():
        assert re.fullmatch("[a-z]+( [a-z]+)*", text)


def test_sampled_guided_requests_under_tree_speculation_match_their_guides(path, tokenizer):
    engine = make_engine(path, speculative_algorithm="eagle", speculative_num_steps=2, speculative_eagle_topk=2)
    requests = {f"s{i}": (PROMPTS[i], guided(temperature=1.0, json=SCHEMA, disable_any_whitespace=True))
                for i in range(4)}
    for text in texts(tokenizer, run_all(engine, requests)).values():
        check_schema(text)


def test_a_guide_that_does_not_compile_ends_its_request_with_the_compilers_message(path):
    engine = make_engine(path)
    finals = record_finished(engine)
    got = run_all(engine, {"regex": (PROMPTS[0], guided(regex="[a-z")),
                           "ebnf": (PROMPTS[1], guided(grammar="root ::= undefined_rule")),
                           "ok": (PROMPTS[2], guided(regex="(ab|cd)"))})
    for rid, kind in (("regex", "regex"), ("ebnf", "ebnf_grammar")):
        assert finals[rid].finish_reason == "error" and got[rid] == []
        assert finals[rid].error.startswith(f"guided decoding: the {kind} does not compile")
    assert finals["ok"].finish_reason == "stop" and got["ok"]
    assert not engine.sequences and engine.scheduler.pages.num_available == engine.num_kv_pages


def test_a_guided_request_waits_for_its_grammar_off_the_engines_thread(path, monkeypatch):
    """Compiles run on the grammar thread: steps go on for the other requests meanwhile, and an
    abort of a request still compiling ends it there."""
    engine = make_engine(path)
    release = threading.Event()
    matcher = engine.grammars.matcher
    monkeypatch.setattr(engine.grammars, "matcher", lambda *a: (release.wait(30), matcher(*a))[1])
    engine.add_request("plain", PROMPTS[0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    engine.add_request("guided", PROMPTS[1], guided(regex="(ab|cd)"))
    engine.add_request("aborted", PROMPTS[2], guided(regex="x"))
    plain = []
    while len(plain) < 4:
        plain += [t for o in engine.step() if o.request_id == "plain" for t in o.new_token_ids]
    assert engine.stats()["waiting"] == 2 and "guided" not in [s.request_id for s in engine.scheduler.running]
    assert engine.abort("aborted").finish_reason == "abort"
    release.set()
    finals = record_finished(engine)
    while engine.has_work():
        engine.step()
    assert set(finals) == {"guided"} and finals["guided"].finish_reason == "stop"


def test_a_guide_whose_every_allowed_token_is_banned_ends_its_request_with_an_error(path, tokenizer, grammars):
    engine = make_engine(path)
    finals = record_finished(engine)
    first = grammars.token_bitmask([(grammars.matcher(Guide("choice", '["yes"]'), {tokenizer.eos_token_id}), ())])
    banned = [[t] for t in allowed_ids(first, 0, grammars.vocab_size)]   # "y", "ye", "yes"
    params = SamplingParams(max_tokens=8, temperature=0, guided_decoding={"choice": ["yes"]}, bad_words_ids=banned)
    run_all(engine, {"r": (PROMPTS[0], params), "other": (PROMPTS[1], guided(regex="(ab|cd)"))})
    assert finals["r"].finish_reason == "error" and "breaks the guide" in finals["r"].error
    assert finals["other"].finish_reason == "stop"
    assert engine.scheduler.pages.num_available == engine.num_kv_pages


@pytest.mark.gpu
@pytest.mark.parametrize("engine_args", [{}, dict(speculative_algorithm="mtp", speculative_num_steps=2)],
                         ids=["graphs-overlap", "mtp-chain-graphs"])
def test_guided_requests_on_the_gpu_match_their_guides_beside_unguided_ones(checkpoint, tokenizer, engine_args):
    """bf16 with CUDA graphs (decode, or a chain's verify) and overlap scheduling; the bitmasks go to
    the GPU and mask logits there. Unguided requests share the batches."""
    engine = Engine(EngineArgs(model=str(checkpoint("deepseek_v32")), device="cuda", page_size=64,
                               num_kv_pages=64, **engine_args))
    assert engine.graphs is not None
    finals = record_finished(engine)
    requests = {f"schema{i}": (PROMPTS[i], guided(temperature=0.7 * (i % 2), json=SCHEMA, disable_any_whitespace=True))
                for i in range(4)}
    requests |= {f"email{i}": (PROMPTS[i], guided(temperature=1.0, regex=EMAIL)) for i in range(4)}
    requests |= {f"plain{i}": (PROMPTS[i], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
                 for i in range(4)}
    got = texts(tokenizer, run_all(engine, requests))
    for i in range(4):
        check_schema(got[f"schema{i}"])
        assert re.fullmatch(EMAIL, got[f"email{i}"])
        assert finals[f"plain{i}"].num_output_tokens == 32
    assert engine.scheduler.pages.num_available == engine.num_kv_pages
