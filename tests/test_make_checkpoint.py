"""The checkpoint tool's command line and what it writes; `python -m dsa_backend generate` on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dsa_backend.config import ModelConfig
from dsa_backend.tools.make_checkpoint import PRESETS, main, make_config


def test_cli_writes_a_complete_huggingface_layout(tmp_path):
    out = tmp_path / "ckpt"
    main(["--arch", "glm_moe_dsa", "--preset", "tiny", "--out", str(out), "--fp8", "--seed", "3",
          "--index-topk-freq", "2", "--index-skip-topk-offset", "1"])
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "model-00001-of-00002.safetensors"} <= files
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["num_nextn_predict_layers"] == 1
    config = ModelConfig.from_pretrained(out)
    assert [p.full for p in config.indexer_plan] == [True, False, True, False]
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.4.eh_proj.weight_scale_inv" in index  # the MTP layer, quantized too
    assert "model.layers.1.self_attn.indexer.wk.weight" not in index  # a shared layer


def test_unknown_preset_is_refused_with_the_choices():
    with pytest.raises(SystemExit, match="tiny"):
        make_config("glm_moe_dsa", "v32-slice")


@pytest.mark.parametrize("arch, preset", sorted(PRESETS))
def test_every_preset_is_a_valid_config(arch, preset):
    config = ModelConfig.from_dict(make_config(arch, preset))
    assert config.kv_lora_rank == 512 and config.qk_rope_head_dim == 64 and config.index_head_dim == 128


def test_shell_generate_runs_on_a_checkpoint_on_one_rank_or_two(checkpoint):
    outputs = []
    for ranks in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-m", "dsa_backend", "generate", "--model", str(checkpoint("glm_moe_dsa")),
             "--prompt", "Hello", "--prompt", "你好", "--max-tokens", "3", "--ignore-eos", "--json",
             "--tensor-parallel-size", ranks], capture_output=True, text=True, check=True, timeout=300)
        outputs.append([json.loads(line) for line in result.stdout.splitlines()])
    lines = outputs[0]
    assert [line["prompt"] for line in lines] == ["Hello", "你好"]
    assert all(len(line["token_ids"]) == 3 and line["finish_reason"] == "length" for line in lines)
    assert outputs[1] == outputs[0]


def test_branch_scale_shrinks_only_the_main_layers_residual_outputs(tmp_path):
    from dsa_backend.tools.make_checkpoint import write_checkpoint
    from dsa_backend.weights import SafetensorsCheckpoint

    cfg = make_config("deepseek_v32", "tiny")
    write_checkpoint(cfg, tmp_path / "plain", seed=2)
    write_checkpoint(cfg, tmp_path / "scaled", seed=2, branch_scale=0.1)
    plain, scaled = SafetensorsCheckpoint(tmp_path / "plain"), SafetensorsCheckpoint(tmp_path / "scaled")
    scaled_names = {n for n in plain.names() if not torch.equal(plain.get(n), scaled.get(n))}
    assert scaled_names == {n for n in plain.names() if n.startswith("model.layers.")
                            and int(n.split(".")[2]) < 4 and n.endswith(("o_proj.weight", "down_proj.weight"))}
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    torch.testing.assert_close(scaled.get(name).float(), 0.1 * plain.get(name).float(), rtol=1e-2, atol=0)
