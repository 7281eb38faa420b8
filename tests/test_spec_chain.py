"""Chain drafting on the GPU alone (dsa_backend/spec/chain.py): spans padded for a graph replay,
tables that reach the held page, and the replays themselves (GPU)."""

from __future__ import annotations

import pytest

from dsa_backend import LLM, SamplingParams
from dsa_backend.spec.chain import ChainDraftGraphs, chain_reach, held_page_tables
from dsa_backend.spec.drafter import ChainDrafts
from dsa_backend.spec.tree import DraftTree
from test_engine import run_all
from test_spec import GREEDY, PROMPTS, engine, plain_greedy


def test_a_chain_writes_its_span_or_padding_and_then_its_steps_past_the_root():
    assert chain_reach(span=1, num_steps=3, padded_to=None) == 3      # root, then steps 1 and 2
    assert chain_reach(span=4, num_steps=3, padded_to=None) == 6
    assert chain_reach(span=1, num_steps=3, padded_to=4) == 4         # padding rows reach further
    assert chain_reach(span=4, num_steps=3, padded_to=4) == 6


def test_tables_reach_the_held_page_only_past_a_requests_own_pages():
    tables = held_page_tables([[3, 4], [5], [6, 7]], ends=[40, 33, 16], page_size=16, held_page=99)
    assert tables == [[3, 4, 99], [5, 99, 99], [6, 7]]


def test_a_step_of_prompt_chunks_runs_the_mtp_layer_once_and_drafts_nothing(checkpoint):
    e = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=3,
               max_num_batched_tokens=32)
    calls, real = [], e.model.forward_mtp
    e.model.forward_mtp = lambda batch, *args: calls.append(batch.num_tokens) or real(batch, *args)
    e.add_request("r", PROMPTS[3], GREEDY)  # 100 tokens: chunks of 32
    e.step()
    assert calls == [32] and e.sequences["r"].draft is None


def test_a_chains_drafts_are_read_back_after_the_verify_that_takes_them_is_launched(checkpoint, monkeypatch):
    # The verify takes the drafts from the GPU, so the host builds and launches it while the
    # draft step may still run; the host reads them only to judge the verify.
    e = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=2)
    e.add_request("r", PROMPTS[0], GREEDY)
    e.step()                                          # the prompt, then its first drafts
    assert e.sequences["r"].draft.unread
    events, forward, read = [], e.model.forward, ChainDrafts.read
    monkeypatch.setattr(e.model, "forward", lambda *args: events.append("verify") or forward(*args))
    monkeypatch.setattr(ChainDrafts, "read", lambda self: events.append("read") or read(self))
    e.step()
    assert events == ["verify", "read"] and e.sequences["r"].draft.unread


def test_chains_draft_again_before_the_host_reads_the_verify(checkpoint, monkeypatch):
    # A verify of chains is judged on the GPU (a sampled request's too): the next drafts are
    # launched behind it, and the host takes its tokens (and appends them) while they run.
    e = engine(checkpoint("deepseek_v32"), 16, speculative_algorithm="mtp", speculative_num_steps=2)
    e.add_request("greedy", PROMPTS[0], GREEDY)
    e.add_request("sampled", PROMPTS[1], SamplingParams(max_tokens=64, temperature=0.8, seed=3, ignore_eos=True))
    e.step()
    events, forward, draft, append = [], e.model.forward, e.drafter.draft_verified_chains, e._append
    monkeypatch.setattr(e.model, "forward", lambda *args: events.append("verify") or forward(*args))
    monkeypatch.setattr(e.drafter, "draft_verified_chains", lambda *args: events.append("draft") or draft(*args))
    monkeypatch.setattr(e, "_append", lambda *args: events.append("append") or append(*args))
    e.step()
    assert events == ["verify", "draft", "append", "append"]
    assert all(s.draft.unread for s in e.sequences.values())


def _record_drafts(monkeypatch) -> list:
    """A list that gets every chain draft handed out, as (request id, tokens), when it is read."""
    made, read = [], ChainDrafts.read

    def recording_read(drafts):
        read(drafts)
        made.extend((seq.request_id, seq.draft.tokens) for seq in drafts.seqs if seq.draft)

    monkeypatch.setattr(ChainDrafts, "read", recording_read)
    return made


@pytest.mark.parametrize("name, steps, page_size", [("deepseek_v32", 2, 16), ("glm_moe_dsa", 3, 1),
                                                    ("glm_shared_freq", 2, 64)])
def test_drafts_of_spans_padded_for_a_replay_equal_the_unpadded_drafts(checkpoint, name, steps, page_size,
                                                                     monkeypatch):
    # Off CUDA a graph set runs its step eagerly on its static buffers: the padding, the held-page
    # tables and the static copies are what a replay runs. Padding rows write past the span (after
    # a verify judged on the GPU, the rejected drafts' rows); if any row read them, the MTP layer's
    # drafts would change. The unpadded reference judges every verify on the host.
    spec = dict(speculative_algorithm="mtp", speculative_num_steps=steps)
    requests = {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS)}
    eager = engine(checkpoint(name), page_size, **spec)
    monkeypatch.setattr(eager, "_judges_on_gpu", lambda batch: False)
    padded = engine(checkpoint(name), page_size, **spec)
    graphs = ChainDraftGraphs(padded.model, padded.cache, steps, padded.spec.reuses_topk,
                              padded.args.max_running_requests, padded.max_model_len, padded.drafter.held_page)
    padded.drafter.graphs = graphs
    replays, real_replay = [], graphs.replay
    graphs.replay = lambda batch, context: replays.append(batch.batch_size) or real_replay(batch, context)
    drafts = _record_drafts(monkeypatch)
    assert run_all(eager, requests) == plain_greedy(checkpoint, name)
    eager_drafts = drafts[:]
    drafts.clear()
    assert run_all(padded, requests) == plain_greedy(checkpoint, name)
    assert len(replays) > 20 and drafts == eager_drafts and len(drafts) > 20
    assert padded.scheduler.pages.num_available == padded.num_kv_pages


def test_padding_requests_of_a_replay_write_only_the_held_page(checkpoint):
    # Page size 1: the draft steps of a padding request (positions n - 1 + step) reach past its n
    # tokens' table columns, into columns an earlier, larger batch left naming its pages.
    e = engine(checkpoint("deepseek_v32"), 1, speculative_algorithm="mtp", speculative_num_steps=3)
    e.drafter.graphs = graphs = ChainDraftGraphs(e.model, e.cache, 3, e.spec.reuses_topk, 8, e.max_model_len,
                                                 e.drafter.held_page)
    stale = e.num_kv_pages - 1            # a page no request holds
    graphs.static.block_table.fill_(stale)
    for i, prompt in enumerate(PROMPTS[:3]):
        e.add_request(f"r{i}", prompt, GREEDY)
    while any(len(s.output_ids) < 2 for s in e.sequences.values()):
        e.step()
    mla = e.cache.mla.buffer.clone()
    e.step()                              # verify and draft 3 requests: bucket 4, one padding request
    changed = (e.cache.mla.buffer != mla).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    owned = {p for s in e.sequences.values() for p in s.pages} | {graphs.pad_page}
    assert changed and set(changed) <= owned and graphs.pad_page in changed


def test_chains_judged_on_the_gpu_without_reserved_pages_draft_into_the_held_page_only(checkpoint, monkeypatch):
    # Page size 1, an oracle's drafts (all accepted): a request whose draft reservation fails
    # still drafts (the drafting is launched before acceptance is known); its steps past its own
    # pages land in the held page, never in another request's, and it decodes plainly afterwards.
    expected = plain_greedy(checkpoint, "deepseek_v32")

    def oracle_hand_to(drafts, seq, request):
        n = len(seq.output_ids)
        seq.draft = DraftTree.chain(expected[seq.request_id][n:n + 3])

    monkeypatch.setattr(ChainDrafts, "hand_to", oracle_hand_to)
    e = engine(checkpoint("deepseek_v32"), 1, speculative_algorithm="mtp", speculative_num_steps=3)
    requests = {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS[:3])}
    for rid, (prompt, params) in requests.items():
        e.add_request(rid, prompt, params)
    while any(len(s.output_ids) < 5 for s in e.sequences.values()):
        e.step()
    reserve = e.scheduler.reserve
    monkeypatch.setattr(e.scheduler, "reserve", lambda seq, num_tokens: False)
    mla = e.cache.mla.buffer.clone()
    e.step()                              # a verify of three full chains, all accepted
    changed = (e.cache.mla.buffer != mla).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    owned = {p for s in e.sequences.values() for p in s.pages}
    assert e.drafter.held_page in changed and set(changed) <= owned | {e.drafter.held_page}
    assert all(s.draft is None for s in e.sequences.values())
    monkeypatch.setattr(e.scheduler, "reserve", reserve)
    got = {rid: list(s.output_ids) for rid, s in e.sequences.items()}
    while e.has_work():
        for out in e.step():
            got[out.request_id] += out.new_token_ids
    assert got == {rid: expected[rid] for rid in requests}
    assert e.scheduler.pages.num_available == e.num_kv_pages


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_chain_drafts_replayed_in_graphs_equal_the_eager_engines(checkpoint, name, monkeypatch):
    # Two requests at most: every batch fills its bucket, so the replays launch the eager
    # drafter's kernels at its shapes (but for the padding and the context bucket).
    args = dict(device="cuda", page_size=16, num_kv_pages=256, max_running_requests=2, max_model_len=2048,
                speculative_algorithm="mtp", speculative_num_steps=3)
    prompts = [list(range(300, 340)), list(range(1000, 1900, 3))]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    drafts = _record_drafts(monkeypatch)
    eager = [out.token_ids for out in LLM(checkpoint(name), cuda_graph=False, **args).generate(prompts, params)]
    eager_drafts = drafts[:]
    drafts.clear()
    llm = LLM(checkpoint(name), **args)
    graphs = llm.engine.drafter.graphs
    replays, real_replay = [], graphs.replay
    monkeypatch.setattr(graphs, "replay", lambda batch, context: replays.append(batch.batch_size)
                        or real_replay(batch, context))
    assert [out.token_ids for out in llm.generate(prompts, params)] == eager
    assert len(replays) >= 8 and graphs.graphs
    # argmax drafts of bf16 logits: a near tie may break the other way in a padded batch
    same = sum(a == b for a, b in zip(drafts, eager_drafts))
    assert len(drafts) == len(eager_drafts) and same >= 0.9 * len(drafts)
    assert llm.engine.scheduler.pages.num_available == llm.engine.num_kv_pages
