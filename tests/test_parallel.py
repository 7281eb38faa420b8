"""Tensor parallelism (dsa_backend/parallel.py, followers.py) on the CPU, ranks meeting over gloo:
which tensors split, shards that put together are the checkpoint, engines of two ranks that
give the tokens of one, and a group that starts again when any of its processes dies."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from checkpoints import random_prompts
from test_engine_runner import Collector
from dsa_backend.config import ConfigError, ModelConfig
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.engine_process import EngineProcess
from dsa_backend.parallel import TensorParallel
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.weights import load_weights, split_dim
from dsa_kernels.reference import dequantize_weight_ref

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def engine_args(path, **kw) -> EngineArgs:
    return EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=16, **kw)


def test_split_dims_follow_the_heads_and_the_hidden_units():
    rows = ["self_attn.q_b_proj", "self_attn.kv_b_proj", "mlp.gate_proj", "mlp.up_proj",
            "mlp.shared_experts.gate_proj", "mlp.experts.7.up_proj"]
    columns = ["self_attn.o_proj", "mlp.down_proj", "mlp.shared_experts.down_proj", "mlp.experts.7.down_proj"]
    replicated = ["self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.indexer.wq_b",
                  "self_attn.indexer.wk", "self_attn.indexer.weights_proj", "mlp.gate", "eh_proj"]
    assert [split_dim(f"model.layers.3.{n}.weight") for n in rows] == [0] * len(rows)
    assert [split_dim(f"model.layers.3.{n}.weight") for n in columns] == [1] * len(columns)
    assert [split_dim(f"model.layers.3.{n}.weight") for n in replicated] == [None] * len(replicated)
    assert split_dim("model.embed_tokens.weight") is None and split_dim("lm_head.weight") is None


def test_a_rank_gets_its_share_of_heads_and_hidden_units_and_a_size_that_does_not_divide_fails(checkpoint):
    config = ModelConfig.from_pretrained(checkpoint("deepseek_v32"))
    share = config.sharded(2)
    assert share.num_attention_heads == config.num_attention_heads // 2
    assert share.moe_intermediate_size == config.moe_intermediate_size // 2
    assert share.intermediate_size == config.intermediate_size // 2
    assert share.kv_lora_rank == config.kv_lora_rank and share.index_n_heads == config.index_n_heads
    with pytest.raises(ConfigError, match=r"num_attention_heads \(4\) is not divisible by tensor_parallel_size \(3\)"):
        config.sharded(3)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        Engine(engine_args(checkpoint("deepseek_v32"), tensor_parallel_size=3))


def _dequantized(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every e4m3 weight of a state dict in float32 (stacked experts one expert at a time)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("_scale_inv"):
            continue
        scale = state.get(name + "_scale_inv")
        if scale is None:
            out[name] = tensor
        elif tensor.dim() == 3:
            out[name] = torch.stack([dequantize_weight_ref(w, s) for w, s in zip(tensor, scale)])
        else:
            out[name] = dequantize_weight_ref(tensor, scale)
    return out


def _put_together(name: str, parts: list[torch.Tensor], config: ModelConfig) -> torch.Tensor:
    """The whole model tensor `name` from its two ranks' parts (stacked tensors part by part)."""
    if name.endswith("q_heads_proj.weight"):     # [q_b rows of the rank's heads | the indexer's wq_b]
        q_rows = config.sharded(2).num_attention_heads * config.qk_head_dim
        assert torch.equal(parts[0][q_rows:], parts[1][q_rows:])
        return torch.cat([parts[0][:q_rows], parts[1][:q_rows], parts[0][q_rows:]])
    if name.endswith(("gate_up_proj.weight", "experts.w13")):    # [gate | up], each split
        dim = 0 if name.endswith("weight") else 1
        gates, ups = zip(*(p.chunk(2, dim) for p in parts))
        return torch.cat([*gates, *ups], dim)
    if name.endswith("kv_b_proj.weight"):
        return torch.cat(parts)
    if name.endswith(("o_proj.weight", "down_proj.weight", "experts.w2")):
        return torch.cat(parts, dim=-1)
    assert torch.equal(parts[0], parts[1]), name
    return parts[0]


@pytest.mark.parametrize("name", ["deepseek_v32", "glm_shared_fp8"])
def test_two_ranks_shards_put_together_are_the_checkpoint(checkpoint, name):
    """In e4m3 a share keeps its blocks and their scales where it ends on a block (the tiny
    model's dense MLP), and is dequantized where it would cut one (its experts and heads)."""
    path = checkpoint(name)
    config = ModelConfig.from_pretrained(path)
    whole, _ = load_weights(path, config, torch.float32)
    shards = [load_weights(path, config, torch.float32, keep_fp8=True, tp=TensorParallel(rank, 2))[0]
              for rank in (0, 1)]
    if config.quantization:
        assert shards[0]["model.layers.0.mlp.gate_up_proj.weight"].dtype == torch.float8_e4m3fn
        assert shards[0]["model.layers.1.mlp.experts.w13"].dtype == torch.float32
    shards = [_dequantized(s) for s in shards]
    assert set(shards[0]) == set(whole)
    for tensor_name, tensor in whole.items():
        assert torch.equal(_put_together(tensor_name, [s[tensor_name] for s in shards], config), tensor), tensor_name


def run_all(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens = {rid: [] for rid in requests}
    while engine.has_work():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return tokens


@pytest.mark.parametrize("name, settings", [
    ("deepseek_v32", {}),
    ("glm_shared_fp8", {}),
    ("glm_moe_dsa", {"speculative_algorithm": "mtp", "speculative_num_steps": 2}),
    ("deepseek_v32", {"speculative_algorithm": "eagle", "speculative_num_steps": 2, "speculative_eagle_topk": 2,
                      "speculative_num_draft_tokens": 4}),
])
def test_two_ranks_give_the_tokens_of_one(checkpoint, name, settings):
    """Greedy, seeded sampled and guided requests batched together, prefill in chunks, then decode
    (or MTP drafting and verify: a chain, and a tree whose accepted path moves in both pools).
    Every rank keeps the guided request's own matcher."""
    prompts = random_prompts([5, 40, 23])
    sampled = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    guided = SamplingParams(max_tokens=8, temperature=1.0, seed=3, guided_decoding={"regex": "[a-z]{80}"})
    requests = {"a": (prompts[0], GREEDY), "b": (prompts[1], GREEDY), "c": (prompts[2], sampled),
                "d": (prompts[1], guided)}
    results = []
    for size in (1, 2):
        engine = Engine(engine_args(checkpoint(name), max_num_batched_tokens=32, tensor_parallel_size=size,
                                    **settings))
        try:
            results.append(run_all(engine, requests))
        finally:
            engine.close()
    assert results[0] == results[1]
    assert all(len(t) == 8 for t in results[1].values())


def _busy_run(engine: Engine) -> tuple[dict, dict]:
    """Requests that share a prefix, outgrow a small pool (retractions) and one aborted mid-way:
    every output (tokens, finish reason) and the engine's counters."""
    shared = random_prompts([32], seed=5)[0]
    prompts = [shared + p for p in random_prompts([3, 17, 30, 9, 25, 12], seed=6)]
    sampled = SamplingParams(max_tokens=24, temperature=0.8, seed=3, ignore_eos=True)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outputs = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, sampled if i % 2 else greedy)
    for step in itertools.count():
        if step == 4:
            outputs.setdefault("3", []).append(engine.abort("3"))
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        if not engine.has_work():
            break
    tokens = {rid: ([t for o in outs for t in o.new_token_ids], outs[-1].finish_reason) for rid, outs in outputs.items()}
    stats = engine.stats()
    return tokens, {k: stats[k] for k in ("retractions", "prefix_cache_hit_tokens", "kv_pages_free", "kv_pages_total")}


def test_two_ranks_stay_in_step_through_retractions_prefix_hits_and_aborts(checkpoint):
    """Anything that parted the ranks' schedules would part their collectives' rows: the outputs
    and counters of a busy run match one rank's."""
    runs = []
    for size in (1, 2):
        engine = Engine(engine_args(checkpoint("deepseek_v32"), num_kv_pages=8, max_num_batched_tokens=48,
                                    tensor_parallel_size=size))
        try:
            runs.append(_busy_run(engine))
        finally:
            engine.close()
    assert runs[0] == runs[1]
    tokens, stats = runs[1]
    assert stats["retractions"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    assert tokens["3"][1] == "abort" and stats["kv_pages_free"] == stats["kv_pages_total"]


def test_a_bad_setting_found_after_the_followers_started_fails_with_its_message_and_stops_them(checkpoint):
    """Every rank meets the bad kv_cache_dtype; rank 0 raises its own error, not a follower's exit."""
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto' or 'fp8', got 'fp16'"):
        Engine(engine_args(checkpoint("glm_moe_dsa"), tensor_parallel_size=2, kv_cache_dtype="fp16"))
    assert _followers_of(os.getpid()) == []


def test_an_llm_of_two_ranks_stops_its_follower_when_its_block_ends(checkpoint):
    from dsa_backend import LLM

    with LLM(checkpoint("glm_moe_dsa"), device="cpu", dtype="float32", tensor_parallel_size=2) as llm:
        assert len(_followers_of(os.getpid())) == 1
        [out] = llm.generate([random_prompts([9])[0]], GREEDY)
        assert len(out.token_ids) == 8
    assert _followers_of(os.getpid()) == []


def _followers_of(pid: int) -> list[int]:
    """The tensor-parallel followers a process spawned (multiprocessing's spawned children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _generate(runner: EngineProcess, rid: str, prompt: list[int], params=GREEDY) -> Collector:
    stream = Collector()
    runner.submit(rid, prompt, params, stream)
    assert stream.done.wait(120), rid
    return stream


def _until_serving(runner: EngineProcess, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while runner._refusal is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runner._refusal is None, runner._refusal


@pytest.mark.parametrize("victim", ["follower", "rank 0"])
def test_a_group_that_loses_a_process_ends_its_requests_and_starts_again(checkpoint, victim):
    prompt = random_prompts([12])[0]
    runner = EngineProcess(engine_args(checkpoint("glm_moe_dsa"), tensor_parallel_size=2))
    try:
        expected = _generate(runner, "first", prompt).tokens
        rank0 = runner._process.pid
        followers = _followers_of(rank0)
        assert len(followers) == 1
        long = Collector()
        runner.submit("long", prompt, SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True), long)
        while not long.outputs:
            time.sleep(0.01)
        os.kill(followers[0] if victim == "follower" else rank0, signal.SIGKILL)
        assert long.done.wait(60)
        last = long.outputs[-1]
        assert last.finish_reason == "error"
        assert last.error.startswith("the engine process has exited (code ")
        deadline = time.monotonic() + 30
        while not all(_gone(p) for p in (rank0, *followers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(p) for p in (rank0, *followers)), "a process of the old group is still running"
        _until_serving(runner)
        assert _generate(runner, "after", prompt).tokens == expected
        assert len(_followers_of(runner._process.pid)) == 1
    finally:
        runner.shutdown(10)


def _prefill_parts(path, dtype, device, tp):
    """A rank's model (TensorParallel without a group: its layers are called one by one), its KV
    cache, a prefill batch of three prompts, RoPE's cos / sin, and the backend."""
    from dsa_backend.attention import default_backend
    from dsa_backend.batch import ForwardBatch, ForwardMode
    from dsa_backend.cache import KVCache, pages_needed
    from dsa_backend.models import load_model

    # weights dequantized: the tiny models' shares cut FP8 blocks, which a rank then takes
    # dequantized while the whole model keeps e4m3 (aligned shares: the weights test above, and
    # DeepSeek-V3.2's sizes on the device, docs/PERFORMANCE.md "Tensor parallelism on one GPU")
    model, info = load_model(path, dtype, device, tp=tp)
    prompts = random_prompts([40, 7, 23])
    cache = KVCache(model.config, 16, 16, dtype=dtype, mtp_has_indexer=info.mtp_has_indexer, device=device)
    pages = [cache.allocator.allocate(pages_needed(len(p), 16)) for p in prompts]
    batch = ForwardBatch.build(ForwardMode.EXTEND, prompts, [0] * len(prompts), pages, 16, device)
    cos, sin = model.rotary(batch.positions)
    return model, cache, batch, cos, sin, default_backend(device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", ["deepseek_v32", "glm_shared_fp8"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
@torch.inference_mode()
def test_each_layers_two_shares_add_up_to_the_layer(checkpoint, device, name, dtype, tolerance):
    """In one process, two ranks' shares of each attention and MLP, summed, against the whole
    model's on the same input: in bf16 within its rounding, with the same top-k. On the GPU through
    its kernels (sparse MLA at a rank's head count)."""
    device = torch.device(device)
    runs = [_prefill_parts(checkpoint(name), dtype, device, tp)
            for tp in (TensorParallel(), TensorParallel(0, 2), TensorParallel(1, 2))]
    whole, _, batch, cos, sin, backend = runs[0]
    x = whole.model.embed_tokens(batch.input_ids)
    topks = [None] * 3
    for i, layer in enumerate(whole.model.layers):
        h = layer.input_layernorm(x)
        attention = []
        for j, (model, cache, b, *_) in enumerate(runs):
            out, topks[j] = model.model.layers[i].self_attn(h, cos, sin, b, cache, backend, topks[j])
            attention.append(out.float())
        assert torch.equal(topks[1], topks[0]) and torch.equal(topks[2], topks[0]), i
        assert (attention[1] + attention[2] - attention[0]).norm() <= tolerance * attention[0].norm(), i
        x = x + attention[0].to(dtype)
        h = layer.post_attention_layernorm(x)
        mlp = [model.model.layers[i].mlp(h).float() for model, *_ in runs]
        assert (mlp[1] + mlp[2] - mlp[0]).norm() <= tolerance * mlp[0].norm(), i
        x = x + mlp[0].to(dtype)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between ranks takes two GPUs")
def test_on_two_gpus_graphed_steps_give_the_eager_steps_tokens_and_free_every_page(checkpoint):
    """NCCL's all-reduces captured in the decode steps' CUDA graphs replay as they ran eagerly, and
    closing ends the follower by itself: once, it waited in NCCL's teardown for rank 0, which
    waited for it, until rank 0 killed it (after 10 s; a served engine's unload overran)."""
    prompts = random_prompts([5, 40, 23, 9])
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts)}
    results = []
    for graphs in (False, True):
        engine = Engine(EngineArgs(model=str(checkpoint("glm_shared_fp8")), device="cuda", page_size=16,
                                   num_kv_pages=64, tensor_parallel_size=2, cuda_graph=graphs))
        followers = engine.followers._processes
        try:
            assert (engine.graphs is not None) == graphs
            results.append(run_all(engine, requests))
            assert engine.stats()["kv_pages_free"] == engine.stats()["kv_pages_total"]
        finally:
            engine.close()
        assert [p.exitcode for p in followers] == [0]
    assert results[0] == results[1]
