"""Checkpoint loading: sharded index, FP8 block dequantization, MTP layer, and naming errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsa_backend.config import ModelConfig
from dsa_backend.tools.make_checkpoint import make_config, write_checkpoint
from dsa_backend.weights import (WeightError, checkpoint_tensor_shapes, dequantize_fp8_block, load_weights,
                                 mtp_checkpoint_tensors, quantize_fp8_block)


def edit_checkpoint(src, dst, edit):
    """Copy a checkpoint, letting edit(tensors) change the second shard's tensors in place."""
    shutil.copytree(src, dst)
    shard = dst / "model-00002-of-00002.safetensors"
    tensors = load_file(shard)
    edit(tensors)
    save_file(tensors, str(shard))
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items()
                           if v != shard.name or k in tensors}
    index["weight_map"].update({k: shard.name for k in tensors})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_fp8_block_roundtrip_is_within_e4m3_precision():
    w = torch.randn(300, 200)
    q, scale = quantize_fp8_block(w, (128, 128))
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 2)
    back = dequantize_fp8_block(q, scale, (128, 128))
    # e4m3 keeps 3 mantissa bits (relative error <= 2^-4); below its normal range the step is
    # 2^-9 of the block scale.
    step = scale.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200] * 2**-9
    assert ((back - w).abs() <= w.abs() * 2**-4 + step).all()


def test_sharded_checkpoint_loads_with_mtp_layer_and_stacked_experts(checkpoint):
    d = checkpoint("glm_moe_dsa")
    config = ModelConfig.from_pretrained(d)
    state, info = load_weights(d, config, torch.float32)
    assert info.mtp_has_indexer
    c = config
    assert state["model.layers.1.mlp.experts.w13"].shape == (c.n_routed_experts, 2 * c.moe_intermediate_size,
                                                              c.hidden_size)
    assert "mtp.0.eh_proj.weight" in state and "mtp.0.decoder.self_attn.indexer.k_norm.weight" in state
    raw = load_file(d / "model-00001-of-00002.safetensors") | load_file(d / "model-00002-of-00002.safetensors")
    gate = raw["model.layers.1.mlp.experts.3.gate_proj.weight"].float()
    assert torch.equal(state["model.layers.1.mlp.experts.w13"][3, : c.moe_intermediate_size], gate)
    # the MTP layer's q_b and its indexer's wq_b, stacked by rows (one GEMM of q_lora)
    q_b, wq_b = (raw[f"model.layers.{c.num_hidden_layers}.self_attn.{n}.weight"].float()
                 for n in ("q_b_proj", "indexer.wq_b"))
    assert torch.equal(state["mtp.0.decoder.self_attn.q_heads_proj.weight"], torch.cat([q_b, wq_b]))
    assert state["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_mtp_tensors_map_back_to_their_checkpoint_names(checkpoint):
    # tools/train_mtp writes the MTP layer back: stacked experts and projections split again
    d = checkpoint("glm_moe_dsa")
    c = ModelConfig.from_pretrained(d)
    state, _ = load_weights(d, c, torch.float32)
    raw = load_file(d / "model-00001-of-00002.safetensors") | load_file(d / "model-00002-of-00002.safetensors")
    back = mtp_checkpoint_tensors(state, c)
    mtp = f"model.layers.{c.num_hidden_layers}."
    assert {mtp + "self_attn.q_a_proj.weight", mtp + "self_attn.indexer.wk.weight",
            mtp + "self_attn.kv_a_proj_with_mqa.weight", mtp + "self_attn.indexer.wq_b.weight"} <= back.keys()
    assert back.keys() == {n for n in raw if n.startswith(mtp)} - {mtp + "embed_tokens.weight",
                                                                     mtp + "shared_head.head.weight"}
    assert all(torch.equal(back[n], raw[n].float()) for n in back)


def test_fp8_checkpoint_is_dequantized_at_load(checkpoint):
    d = checkpoint("deepseek_v32_fp8")
    config = ModelConfig.from_pretrained(d)
    raw = load_file(d / "model-00001-of-00002.safetensors") | load_file(d / "model-00002-of-00002.safetensors")
    name = "model.layers.0.self_attn.o_proj.weight"
    assert raw[name].dtype == torch.float8_e4m3fn
    state, _ = load_weights(d, config, torch.float32)
    expected = dequantize_fp8_block(raw[name], raw[name + "_scale_inv"], (128, 128))
    assert torch.equal(state[name], expected)


def test_missing_tensor_is_named(checkpoint, tmp_path):
    def drop(t):
        del t[sorted(t)[0]]
    src = checkpoint("glm_moe_dsa")
    victim = sorted(load_file(src / "model-00002-of-00002.safetensors"))[0]
    d = edit_checkpoint(src, tmp_path / "c", drop)
    with pytest.raises(WeightError, match=f"missing {victim.replace('.', '[.]')}"):
        load_weights(d, ModelConfig.from_pretrained(d), torch.float32)


def test_unexpected_tensor_is_named(checkpoint, tmp_path):
    d = edit_checkpoint(checkpoint("glm_moe_dsa"), tmp_path / "c",
                        lambda t: t.update({"model.layers.0.mystery.weight": torch.zeros(2)}))
    with pytest.raises(WeightError, match="unexpected tensor model.layers.0.mystery.weight"):
        load_weights(d, ModelConfig.from_pretrained(d), torch.float32)


def test_misshaped_tensor_is_named(checkpoint, tmp_path):
    src = checkpoint("glm_moe_dsa")
    victim = sorted(load_file(src / "model-00002-of-00002.safetensors"))[0]
    d = edit_checkpoint(src, tmp_path / "c", lambda t: t.update({victim: torch.zeros(3, 3)}))
    with pytest.raises(WeightError, match=f"{victim.replace('.', '[.]')} has shape \\(3, 3\\)"):
        load_weights(d, ModelConfig.from_pretrained(d), torch.float32)


def test_shared_layer_with_indexer_weights_is_rejected(checkpoint, tmp_path):
    # A checkpoint written for all-full layers, then declared F S F S: layer 1 must not have an indexer.
    d = tmp_path / "c"
    shutil.copytree(checkpoint("glm_moe_dsa"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(index_topk_freq=2, index_skip_topk_offset=1)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match="unexpected tensor model.layers.1.self_attn.indexer.*layer 1 is shared"):
        load_weights(d, ModelConfig.from_pretrained(d), torch.float32)


def test_full_layer_without_indexer_weights_is_rejected(checkpoint, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(checkpoint("glm_shared_freq"), d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["index_topk_freq"], cfg["index_skip_topk_offset"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match="missing model.layers.1.self_attn.indexer.*layer 1 is full"):
        load_weights(d, ModelConfig.from_pretrained(d), torch.float32)


def test_mtp_layer_without_indexer_weights_loads(tmp_path):
    cfg = make_config("glm_moe_dsa", "tiny")
    write_checkpoint(cfg, tmp_path / "full")
    d = edit_checkpoint(tmp_path / "full", tmp_path / "c", lambda t: [
        t.pop(k) for k in list(t) if k.startswith("model.layers.4.self_attn.indexer.")])
    for shard in ("model-00001-of-00002.safetensors",):
        t = load_file(d / shard)
        kept = {k: v for k, v in t.items() if not k.startswith("model.layers.4.self_attn.indexer.")}
        save_file(kept, str(d / shard))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items()
                           if not k.startswith("model.layers.4.self_attn.indexer.")}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    config = ModelConfig.from_pretrained(d)
    state, info = load_weights(d, config, torch.float32)
    assert not info.mtp_has_indexer
    assert not any(k.startswith("mtp.0.decoder.self_attn.indexer") for k in state)


def test_expected_shapes_cover_the_mtp_layer():
    config = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    shapes = checkpoint_tensor_shapes(config)
    assert shapes["model.layers.4.eh_proj.weight"] == (config.hidden_size, 2 * config.hidden_size)
    assert "model.layers.4.self_attn.indexer.wk.weight" in shapes



def test_each_layers_experts_are_stacked_before_the_next_layer_is_read(checkpoint, monkeypatch):
    """So that loading holds one layer's per-expert tensors at a time beside the stacked ones."""
    import dsa_backend.weights as weights

    unstacked, most = [0], [0]

    def read(ckpt, name, *args):
        unstacked[0] += ".experts." in name
        most[0] = max(most[0], unstacked[0])
        return real_read(ckpt, name, *args)

    def stack(*args):
        unstacked[0] = 0
        return real_stack(*args)

    real_read, real_stack = weights._read_share, weights._stacked_experts
    monkeypatch.setattr(weights, "_read_share", read)
    monkeypatch.setattr(weights, "_stacked_experts", stack)
    d = checkpoint("deepseek_v32")
    config = ModelConfig.from_pretrained(d)
    state, _ = load_weights(d, config, torch.float32)
    assert most[0] == 3 * config.n_routed_experts
    assert unstacked[0] == 0 and sum(name.endswith("experts.w13") for name in state) > 1
