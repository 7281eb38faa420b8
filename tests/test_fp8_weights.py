"""An FP8 checkpoint's weights kept in e4m3: the loader, the model's Fp8Linear layers and routed
experts, and the engine's fp8_weights setting. On the CPU the GEMMs run on the references."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import random_prompts
from dsa_backend import LLM, SamplingParams
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.config import ModelConfig
from dsa_backend.engine import EngineArgs
from dsa_backend.models import load_model
from dsa_backend.models.fp8_linear import Fp8Linear
from dsa_backend.weights import dequantize_fp8_block, load_weights, stacked_projections
from dsa_kernels.reference import dequantize_weight_ref

FP8 = torch.float8_e4m3fn


def _raw(d):
    return load_file(d / "model-00001-of-00002.safetensors") | load_file(d / "model-00002-of-00002.safetensors")


def test_kept_weights_are_the_checkpoints_bytes_and_scales(checkpoint):
    d = checkpoint("deepseek_v32_fp8")
    raw = _raw(d)
    state, _ = load_weights(d, ModelConfig.from_pretrained(d), torch.float32, keep_fp8=True)
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight"):
        assert state[name].dtype == FP8
        assert torch.equal(state[name].view(torch.uint8), raw[name].view(torch.uint8))
        assert torch.equal(state[name + "_scale_inv"], raw[name + "_scale_inv"])


@pytest.mark.parametrize("name, layer", [("deepseek_v32_fp8", 1), ("deepseek_v32_fp8", 4), ("glm_shared_fp8", 1)])
def test_stacked_projections_dequantize_to_their_parts(checkpoint, name, layer):
    # q_a | wk | kv_a and q_b | wq_b, one GEMM each (mla.py). The tiny preset's 64 q_a rows end
    # inside a block, so qkv_a gets a scale a row; q_b's 384 rows end on one, so q_heads keeps blocks.
    d = checkpoint(name)
    c = ModelConfig.from_pretrained(d)
    raw = _raw(d)
    state, _ = load_weights(d, c, torch.float32, keep_fp8=True)
    prefix = f"model.layers.{layer}.self_attn." if layer < c.num_hidden_layers else "mtp.0.decoder.self_attn."
    ckpt_prefix = f"model.layers.{layer}.self_attn."
    has_indexer = ckpt_prefix + "indexer.wk.weight" in raw
    assert has_indexer == (name == "deepseek_v32_fp8")  # GLM's layer 1 reuses layer 0's top-k
    for stacked, parts in stacked_projections(c, has_indexer).items():
        weight, scale = state[prefix + stacked + ".weight"], state[prefix + stacked + ".weight_scale_inv"]
        assert weight.dtype == FP8 and prefix + parts[0][0] + ".weight" not in state
        assert scale.shape[0] == (weight.shape[0] if stacked == "qkv_a_proj" else -(-weight.shape[0] // 128))
        full = dequantize_weight_ref(weight, scale)
        for (part, _), got in zip(parts, full.split([rows for _, rows in parts])):
            w = ckpt_prefix + part + ".weight"
            assert torch.equal(got, dequantize_fp8_block(raw[w], raw[w + "_scale_inv"], (128, 128)))


@pytest.mark.parametrize("mlp, rows_per_scale", [("model.layers.0.mlp.", 128), ("model.layers.2.mlp.shared_experts.", 1),
                                                 ("mtp.0.decoder.mlp.shared_experts.", 1)])
def test_dense_mlp_gate_and_up_stack_dequantizes_to_its_parts(checkpoint, mlp, rows_per_scale):
    # the tiny preset's dense gate has 256 rows (ends on a block: block scales kept), a shared
    # expert's 64 (ends inside one: a scale a row)
    d = checkpoint("deepseek_v32_fp8")
    c = ModelConfig.from_pretrained(d)
    raw = _raw(d)
    state, _ = load_weights(d, c, torch.float32, keep_fp8=True)
    weight, scale = state[mlp + "gate_up_proj.weight"], state[mlp + "gate_up_proj.weight_scale_inv"]
    assert weight.dtype == FP8 and mlp + "gate_proj.weight" not in state and mlp + "up_proj.weight" not in state
    assert scale.shape[0] == -(-weight.shape[0] // rows_per_scale)
    ckpt = mlp.replace("mtp.0.decoder.", f"model.layers.{c.num_hidden_layers}.")
    for part, got in zip(("gate_proj", "up_proj"), dequantize_weight_ref(weight, scale).chunk(2)):
        w = ckpt + part + ".weight"
        assert torch.equal(got, dequantize_fp8_block(raw[w], raw[w + "_scale_inv"], (128, 128)))


def test_a_stack_with_an_unquantized_part_is_dequantized_whole(checkpoint, tmp_path):
    # a checkpoint whose indexer wk comes in bf16: qkv_a cannot be e4m3, so all of it is in dtype
    d = checkpoint("deepseek_v32_fp8")
    shutil.copytree(d, tmp_path / "mixed")
    name = "model.layers.1.self_attn.indexer.wk.weight"
    shard = next(p for p in (tmp_path / "mixed").glob("*.safetensors") if name in load_file(p))
    tensors = load_file(shard)
    tensors[name] = dequantize_fp8_block(tensors[name], tensors.pop(name + "_scale_inv"), (128, 128)).bfloat16()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path = tmp_path / "mixed" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][name + "_scale_inv"]
    index_path.write_text(json.dumps(index))
    c = ModelConfig.from_pretrained(d)
    raw = _raw(d)
    state, _ = load_weights(tmp_path / "mixed", c, torch.float32, keep_fp8=True)
    stacked = state["model.layers.1.self_attn.qkv_a_proj.weight"]
    assert stacked.dtype == torch.float32 and "model.layers.1.self_attn.qkv_a_proj.weight_scale_inv" not in state
    parts = [dequantize_fp8_block(raw[f"model.layers.1.self_attn.{p}.weight"],
                                  raw[f"model.layers.1.self_attn.{p}.weight_scale_inv"], (128, 128))
             for p in ("q_a_proj", "indexer.wk", "kv_a_proj_with_mqa")]
    parts[1] = parts[1].bfloat16().float()
    assert torch.equal(stacked, torch.cat(parts))
    assert state["model.layers.1.self_attn.q_heads_proj.weight"].dtype == FP8  # the other stack stays e4m3


def test_kv_b_proj_is_dequantized_even_when_the_rest_stays_fp8(checkpoint):
    # it is folded per head into the query and the output (mla.py), never applied as a linear layer
    d = checkpoint("deepseek_v32_fp8")
    raw = _raw(d)
    state, _ = load_weights(d, ModelConfig.from_pretrained(d), torch.float32, keep_fp8=True)
    name = "model.layers.2.self_attn.kv_b_proj.weight"
    assert state[name].dtype == torch.float32 and name + "_scale_inv" not in state
    assert torch.equal(state[name], dequantize_fp8_block(raw[name], raw[name + "_scale_inv"], (128, 128)))


def test_stacked_experts_dequantize_to_the_per_expert_weights(checkpoint):
    d = checkpoint("deepseek_v32_fp8")
    c = ModelConfig.from_pretrained(d)
    raw = _raw(d)
    state, _ = load_weights(d, c, torch.float32, keep_fp8=True)
    prefix, rows = "model.layers.1.mlp.experts", c.moe_intermediate_size
    w13, w2 = state[prefix + ".w13"], state[prefix + ".w2"]
    assert w13.dtype == FP8 and w2.dtype == FP8
    # the tiny preset's 64 gate rows end inside a 128-row block: one scale row a weight row
    assert state[prefix + ".w13_scale_inv"].shape == (c.n_routed_experts, 2 * rows, 1)
    assert state[prefix + ".w2_scale_inv"].shape == (c.n_routed_experts, 1, 1)
    w13_full = dequantize_weight_ref(w13, state[prefix + ".w13_scale_inv"])
    w2_full = dequantize_weight_ref(w2, state[prefix + ".w2_scale_inv"])
    for e in (0, 5):
        for part, got in (("gate", w13_full[e, :rows]), ("up", w13_full[e, rows:]), ("down", w2_full[e])):
            name = f"{prefix}.{e}.{part}_proj.weight"
            assert torch.equal(got, dequantize_fp8_block(raw[name], raw[name + "_scale_inv"], (128, 128)))


def test_model_holds_fp8_linears_and_no_meta_tensors(checkpoint):
    model, _ = load_model(checkpoint("deepseek_v32_fp8"), torch.float32, keep_fp8=True)
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_a_proj, Fp8Linear) and isinstance(model.mtp[0].eh_proj, Fp8Linear)
    assert isinstance(attn.kv_b_proj, torch.nn.Linear) and not isinstance(attn.kv_b_proj, Fp8Linear)
    assert model.lm_head.weight.dtype == torch.float32  # the head and embedding are never quantized
    assert not any(t.is_meta for t in model.state_dict().values())


def _fake_quantized(x: torch.Tensor) -> torch.Tensor:
    """x through e4m3 and back in 1 x 128 groups, in plain torch: the oracle's activations."""
    padded = torch.nn.functional.pad(x.float(), (0, -x.shape[-1] % 128)).unflatten(-1, (-1, 128))
    scale = padded.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0
    return ((padded / scale).to(FP8).float() * scale).flatten(-2)[..., : x.shape[-1]].to(x.dtype)


@torch.no_grad()
def _hidden(path, prompts, keep_fp8: bool, layer: int | None = None, fake_quantized=(), device="cpu",
            dtype=torch.float32) -> torch.Tensor:
    """The prefill's final hidden states, or one decoder layer's output; the inputs of the
    linear layers named in fake_quantized go through e4m3 and back."""
    model, _ = load_model(path, dtype, device, keep_fp8=keep_fp8)
    for name in fake_quantized:
        model.get_submodule(name).register_forward_pre_hook(lambda m, args: (_fake_quantized(args[0]),))
    seen = {}
    if layer is not None:
        model.model.layers[layer].register_forward_hook(lambda m, i, o: seen.__setitem__("out", o[0]))
    cache = KVCache(model.config, 32, 16, dtype=dtype, device=device)
    pages = [cache.allocator.allocate(pages_needed(len(p), 16)) for p in prompts]
    batch = ForwardBatch.build(ForwardMode.EXTEND, prompts, [0] * len(prompts), pages, 16, device)
    hidden = model(batch, cache).hidden
    return (hidden if layer is None else seen["out"]).float().cpu()


@pytest.mark.parametrize("name", ["deepseek_v32_fp8", "glm_shared_fp8"])
def test_fp8_forward_equals_dequantized_weights_on_e4m3_activations(checkpoint, monkeypatch, name):
    # An oracle of plain torch ops: the weights dequantized at load, every quantized layer's input
    # (the routed experts' through torch._grouped_mm) rounded through e4m3 and back.
    grouped_mm = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda a, b, offs: grouped_mm(_fake_quantized(a), b, offs=offs))
    path, prompts = checkpoint(name), random_prompts((20, 45, 70), seed=5)
    kept, _ = load_model(path, torch.float32, keep_fp8=True)
    fp8_linears = {n: m for n, m in kept.named_modules() if isinstance(m, Fp8Linear)}
    # every quantized weight of the checkpoint but kv_b_proj and the routed experts' is in an
    # Fp8Linear (some stacked by rows in one)
    raw = _raw(path)
    quantized = [n[: -len("_scale_inv")] for n in raw if n.endswith(".weight_scale_inv")
                 and ".experts." not in n and "kv_b_proj" not in n]
    assert sum(m.weight.numel() for m in fp8_linears.values()) == sum(raw[n].numel() for n in quantized) > 0
    want = _hidden(path, prompts, keep_fp8=False, fake_quantized=fp8_linears)
    monkeypatch.setattr(torch, "_grouped_mm", grouped_mm)
    got = _hidden(path, prompts, keep_fp8=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_fp8_first_layer_stays_close_to_the_dequantized_one(checkpoint):
    # The activations' e4m3 rounding moves the first layer's output of this random model by 4.6%
    # (measured 2026-11-28; later layers amplify it, and past index_topk the indexer picks other
    # keys); a wrong scale or layout moves it by 100% or more.
    path, prompts = checkpoint("deepseek_v32_fp8"), random_prompts((20, 45, 70), seed=5)
    exact = _hidden(path, prompts, keep_fp8=False, layer=0)
    fp8 = _hidden(path, prompts, keep_fp8=True, layer=0)
    assert (fp8 - exact).norm() / exact.norm() < 0.08


def test_fp8_weights_setting_is_checked_and_auto_dequantizes_on_the_cpu():
    assert not EngineArgs(model="m").keeps_fp8_weights(torch.device("cpu"))
    assert EngineArgs(model="m", fp8_weights="keep").keeps_fp8_weights(torch.device("cpu"))
    assert not EngineArgs(model="m", fp8_weights="dequantize").keeps_fp8_weights(torch.device("cpu"))
    with pytest.raises(ValueError, match="fp8_weights must be one of auto, keep, dequantize; got 'fp16'"):
        EngineArgs(model="m", fp8_weights="fp16").keeps_fp8_weights(torch.device("cpu"))


def test_engine_with_kept_fp8_weights_drafts_with_the_mtp_layer_and_keeps_greedy_output(checkpoint):
    prompts, params = random_prompts((30, 50), seed=2), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outputs = []
    for spec in ({}, dict(speculative_algorithm="mtp", speculative_num_steps=2)):
        llm = LLM(checkpoint("deepseek_v32_fp8"), device="cpu", dtype="float32", fp8_weights="keep", **spec)
        assert isinstance(llm.engine.model.model.layers[1].self_attn.o_proj, Fp8Linear)
        assert isinstance(llm.engine.model.mtp[0].decoder.self_attn.q_heads_proj, Fp8Linear)  # the drafter's too
        outputs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert [len(t) for t in outputs[0]] == [6, 6]
    assert outputs[1] == outputs[0]  # speculation changes no greedy token


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_fp8_engine_on_cuda_keeps_fp8_and_its_graphs_equal_the_eager_steps(checkpoint):
    path = checkpoint("deepseek_v32_fp8")
    prompts = random_prompts((20, 45, 70, 100), seed=3)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    runs = {}
    for graphs in (True, False):
        llm = LLM(path, device="cuda", cuda_graph=graphs, max_running_requests=4, num_kv_pages=64)
        assert isinstance(llm.engine.model.model.layers[0].self_attn.qkv_a_proj, Fp8Linear)  # "auto" keeps them
        assert (llm.engine.graphs is not None) == graphs
        runs[graphs] = [o.token_ids for o in llm.generate(prompts, params)]
        del llm
    assert runs[True] == runs[False]


@pytest.mark.gpu
def test_fp8_first_layer_on_cuda_stays_close_to_the_dequantized_one(checkpoint):
    path, prompts = checkpoint("deepseek_v32_fp8"), random_prompts((20, 45, 70), seed=5)
    exact = _hidden(path, prompts, keep_fp8=False, layer=0, device="cuda", dtype=torch.bfloat16)
    fp8 = _hidden(path, prompts, keep_fp8=True, layer=0, device="cuda", dtype=torch.bfloat16)
    assert (fp8 - exact).norm() / exact.norm() < 0.08  # 4.6% on the CPU in float32
