"""ModelConfig: raw-field restoration, indexer plans, YaRN, FP8 config, and load-time errors."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from dsa_backend.config import ConfigError, ModelConfig, indexer_plan
from dsa_backend.tools.make_checkpoint import make_config


def glm(**overrides) -> dict:
    return {**make_config("glm_moe_dsa", "tiny"), **overrides}


def full_flags(cfg: dict) -> list[bool]:
    return [p.full for p in indexer_plan(cfg, cfg["num_hidden_layers"])]


@pytest.mark.parametrize("freq, offset, expected", [
    # the seed's formula: layer i is full iff max(i - offset + 1, 0) % freq == 0
    (1, 2, "FFFFFF"),
    (2, 1, "FSFSFS"),
    (2, 2, "FFSFSF"),
    (3, 2, "FFSSFS"),
    (3, 4, "FFFFSS"),
    (4, 3, "FFFSSS"),
])
def test_freq_offset_formula_matches_the_seed_table(freq, offset, expected):
    cfg = glm(num_hidden_layers=6, index_topk_freq=freq, index_skip_topk_offset=offset)
    assert "".join("F" if f else "S" for f in full_flags(cfg)) == expected


def test_default_offset_counts_from_layer_one_like_the_original_rule():
    cfg = glm(num_hidden_layers=6, index_topk_freq=2)
    # SGLang's original rule: skip_topk = max(i - 1, 0) % freq != 0
    assert full_flags(cfg) == [max(i - 1, 0) % 2 == 0 for i in range(6)]


def test_next_skip_topk_marks_layers_followed_by_a_shared_layer():
    plan = indexer_plan(glm(index_topk_pattern="FSFF"), 4)
    assert [p.next_skip_topk for p in plan] == [True, False, False, False]
    assert [p.skip_topk for p in plan] == [False, True, False, False]


def test_pattern_string_and_list_give_the_same_plan():
    assert full_flags(glm(index_topk_pattern="FSSF")) == full_flags(glm(index_topk_pattern=list("FSSF")))


def test_indexer_types_win_over_pattern_and_freq():
    cfg = glm(indexer_types=["full", "shared", "full", "full"], index_topk_pattern="FFFF", index_topk_freq=4)
    assert full_flags(cfg) == [True, False, True, True]


def test_pattern_wins_over_freq_and_offset():
    cfg = glm(index_topk_pattern="FFSF", index_topk_freq=2, index_skip_topk_offset=1)
    assert full_flags(cfg) == [True, True, False, True]


@pytest.mark.parametrize("overrides, field", [
    (dict(index_skip_topk_offset=0, index_topk_freq=2), "index_skip_topk_offset"),
    (dict(index_skip_topk_offset=-1, index_topk_freq=2), "index_skip_topk_offset"),
    (dict(index_topk_freq=0), "index_topk_freq"),
    (dict(index_topk_pattern="FSF"), "index_topk_pattern"),
    (dict(index_topk_pattern="SFFF"), "index_topk_pattern"),
    (dict(index_topk_pattern="FXFF"), "index_topk_pattern"),
    (dict(indexer_types=["full", "shared"]), "indexer_types"),
    (dict(indexer_types=["shared", "full", "full", "full"]), "layer 0"),
    (dict(indexer_types=["full", "maybe", "full", "full"]), "indexer_types"),
    (dict(architectures=["LlamaForCausalLM"]), "architectures"),
    (dict(q_lora_rank=None), "q_lora_rank"),
    (dict(n_group=3), "n_group"),
    (dict(topk_group=4, n_group=2), "topk_group"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(index_topk=-5), "index_topk"),
    (dict(qk_rope_head_dim=256), "qk_rope_head_dim"),
    (dict(num_nextn_predict_layers=-1), "num_nextn_predict_layers"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling.type"),
    (dict(rope_scaling={"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}), "factor"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "original_max_position_embeddings"),
    (dict(quantization_config={"quant_method": "awq"}), "quant_method"),
    (dict(quantization_config={"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}), "fmt"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]}), "weight_block_size"),
])
def test_invalid_config_fails_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_dict(glm(**overrides))


def test_fp8_block_config_is_read():
    cfg = make_config("deepseek_v32", "tiny", fp8=True)
    assert ModelConfig.from_dict(cfg).quantization.block == (128, 128)


def test_yarn_inverse_frequencies_and_mscale_match_transformers(tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = make_config("deepseek_v32", "v32-slice")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = AutoConfig.from_pretrained(tmp_path)
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    ours = ModelConfig.from_pretrained(tmp_path)
    our_freq, our_factor = ours.rope.inv_freq_and_attention_factor()
    assert (our_freq == inv_freq).all()
    assert our_factor == pytest.approx(factor)
    # DeepSeek's softmax scale: qk_head_dim^-0.5 * (0.1 * mscale_all_dim * ln(factor) + 1)^2
    import math
    assert ours.softmax_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)


def test_raw_fields_restored_over_what_transformers_rewrites(tmp_path):
    # transformers' GLM config drops index_topk_freq / offset into indexer_types with its own
    # defaults and rewrites head_dim; the raw config.json values must win.
    cfg = glm(index_topk_freq=2, index_skip_topk_offset=1, qk_rope_head_dim=64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = ModelConfig.from_pretrained(tmp_path)
    assert [p.full for p in ours.indexer_plan] == [True, False, True, False]
    assert ours.qk_rope_head_dim == 64 and ours.qk_head_dim == cfg["qk_nope_head_dim"] + 64


def test_mtp_layer_count_and_arch_rope_style():
    v32 = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    g = ModelConfig.from_dict(glm())
    assert v32.num_nextn_predict_layers == 1
    assert not v32.indexer_rope_interleaved and g.indexer_rope_interleaved


def test_missing_config_json_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)
