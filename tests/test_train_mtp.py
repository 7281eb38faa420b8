"""MTP distillation: gradients reach only the MTP layer, the loss falls, the result loads and drafts."""

from __future__ import annotations

import torch

from checkpoints import random_prompts
from dsa_backend import LLM, SamplingParams
from dsa_backend.tools.make_checkpoint import make_config, write_checkpoint
from dsa_backend.tools.train_mtp import acceptance, identity_init, make_sequences, mtp_loss, save_distilled
from dsa_backend.weights import SafetensorsCheckpoint


def test_distillation_lowers_the_loss_and_writes_a_loadable_checkpoint(checkpoint, tmp_path):
    path = checkpoint("glm_moe_dsa")
    llm = LLM(path, device="cpu", dtype="float32")
    data = make_sequences(llm, count=2, prompt_len=12, new_tokens=8, seed=0)
    params = [p for n, p in llm.engine.model.named_parameters() if n.startswith("mtp.")]
    frozen = {n: p.clone() for n, p in llm.engine.model.named_parameters() if not n.startswith("mtp.")}
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    for _ in range(8):
        loss = mtp_loss(llm, data, page_size=16)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8
    assert all(torch.equal(p, frozen[n]) for n, p in llm.engine.model.named_parameters() if n in frozen)

    out = tmp_path / "distilled"
    save_distilled(llm, path, out)
    name = "model.layers.4.eh_proj.weight"
    assert not torch.equal(SafetensorsCheckpoint(out).get(name), SafetensorsCheckpoint(path).get(name))
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompts = random_prompts([15, 40], seed=41)
    plain = LLM(path, device="cpu", dtype="float32").generate(prompts, params)
    spec = LLM(out, device="cpu", dtype="float32", speculative_algorithm="mtp",
               speculative_num_steps=2).generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


def test_identity_mtp_drafts_what_a_structured_target_accepts(tmp_path):
    """On a branch-scaled target, the identity-initialised layer's drafts are often accepted;
    the random layer's almost never are."""
    path = tmp_path / "target"
    write_checkpoint(make_config("deepseek_v32", "tiny"), path, seed=3, branch_scale=0.1)
    llm = LLM(path, device="cpu", dtype="float32", num_kv_pages=64)
    held_out = make_sequences(llm, count=4, prompt_len=16, new_tokens=16, seed=9)
    identity_init(llm)
    save_distilled(llm, path, tmp_path / "identity")
    del llm
    assert acceptance(path, held_out, "cpu", max_tokens=16) < 0.05
    assert acceptance(tmp_path / "identity", held_out, "cpu", max_tokens=16) > 0.15
