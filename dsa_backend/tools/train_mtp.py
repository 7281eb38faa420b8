"""Distil a checkpoint's MTP layer on the target's own greedy continuations.

    python -m dsa_backend.tools.train_mtp --model DIR --out DIR [--steps N] [--device cuda]

Random checkpoints come with a random MTP layer, whose drafts are almost never accepted. This
trains that layer (the main model stays frozen) to predict, at position i, the target's
distribution for position i + 2 from the target's hidden state at i and the token at i + 1 — what
it is asked in speculative decoding — then writes a copy of the checkpoint with the new MTP tensors.

A random target is only learnable if its continuations have structure: build it with
`make_checkpoint --branch-scale 0.1` (see there). By default the layer starts as the identity on
the next token's embedding (`--init identity`), the usual zero-initialised residual block, so
training refines a sensible drafter instead of first unlearning random weights; `--init
checkpoint` fine-tunes the stored layer instead (a real release's trained MTP layer).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsa_backend.attention import TorchDsaBackend
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.llm import LLM
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.tools.make_checkpoint import is_quantized_weight
from dsa_backend.weights import mtp_checkpoint_tensors, quantize_fp8_block

logger = logging.getLogger(__name__)
MTP_SHARD = "model-mtp-distilled.safetensors"
# Enough for the tool's own sequences; the engine would otherwise take most of a GPU for its pool.
_KV_PAGES = 512


def make_sequences(llm: LLM, count: int, prompt_len: int, new_tokens: int, seed: int) -> list[list[int]]:
    """Random prompts followed by the target's greedy continuation."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(llm.tokenizer.vocab_size, llm.engine.config.vocab_size)
    prompts = [torch.randint(2, vocab, (prompt_len,), generator=gen).tolist() for _ in range(count)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))
    return [p + o.token_ids for p, o in zip(prompts, outs)]


def identity_init(llm: LLM) -> None:
    """Make every MTP layer pass the next token's normalised embedding straight to the head:
    eh_proj keeps the embedding half, and the decoder's residual branches start at zero."""
    for mtp in llm.engine.model.mtp:
        with torch.no_grad():
            hidden = mtp.eh_proj.weight.shape[0]
            mtp.eh_proj.weight.zero_()
            mtp.eh_proj.weight[:, :hidden] = torch.eye(hidden)
            for name, param in mtp.decoder.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "experts.w2")):
                    param.zero_()


def mtp_loss(llm: LLM, sequences: list[list[int]], page_size: int = 64) -> torch.Tensor:
    """KL divergence from the target's distribution for token i + 2 to the MTP layer's: the whole
    distribution teaches far more per token than the greedy label alone (and serves sampling too)."""
    model, config, device = llm.engine.model, llm.engine.config, llm.engine.device
    cache = KVCache(config, sum(pages_needed(len(s), page_size) for s in sequences), page_size,
                    dtype=llm.engine.dtype, device=device)
    pages = [cache.allocator.allocate(pages_needed(len(s), page_size)) for s in sequences]
    with torch.no_grad():
        target = model(ForwardBatch.build(ForwardMode.EXTEND, sequences, [0] * len(sequences), pages, page_size,
                                          device, all_logits=True), cache)
    offsets = [0]
    for s in sequences:
        offsets.append(offsets[-1] + len(s))
    # MTP row i (tokens i + 1, hidden i) learns the target's greedy choice at row i + 1.
    keep = torch.cat([torch.arange(a, b - 1) for a, b in zip(offsets, offsets[1:])]).to(device)
    target_logprobs = torch.log_softmax(target.logits[keep + 1], dim=-1)
    batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [s[1:] for s in sequences], [0] * len(sequences), pages,
                               page_size, device, all_logits=True)
    out = model.forward_mtp(batch, cache, target.hidden[keep], target.topk[keep])
    return torch.nn.functional.kl_div(torch.log_softmax(out.logits, dim=-1), target_logprobs, log_target=True,
                                      reduction="batchmean")


def save_distilled(llm: LLM, model_dir: Path, out: Path) -> None:
    """Copy the checkpoint, pointing the MTP tensors at a new shard with the trained values."""
    config = llm.engine.config
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    tensors = {}
    state = {k: v.detach().float().cpu() for k, v in llm.engine.model.state_dict().items() if k.startswith("mtp.")}
    for name, value in mtp_checkpoint_tensors(state, config).items():
        if config.quantization is not None and is_quantized_weight(name):
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(value, config.quantization.block)
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = value
        else:
            tensors[name] = value.to(torch.bfloat16).contiguous()
    save_file(tensors, str(out / MTP_SHARD), metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["weight_map"].update({name: MTP_SHARD for name in tensors})
    index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def acceptance(model_dir: Path, sequences: list[list[int]], device: str, steps: int = 2,
               max_tokens: int = 32) -> float:
    """Fraction of drafts accepted when greedily continuing held-out prompts."""
    llm = LLM(model_dir, device=device, num_kv_pages=_KV_PAGES, speculative_algorithm="mtp",
              speculative_num_steps=steps)
    prompts = [s[: len(s) // 2] for s in sequences]
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"eval-{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    drafted = accepted = 0
    while engine.has_work():
        for out in engine.step():
            if out.finished:
                drafted += out.num_draft_tokens
                accepted += out.num_accepted_draft_tokens
    return accepted / max(drafted, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sequences", type=int, default=64, help="training sequences of target continuations")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--init", choices=("identity", "checkpoint"), default="identity",
                        help="start from an identity MTP layer (random checkpoints) or the stored one")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    # float32 keeps the optimizer simple; the trained tensors are stored like the rest (bf16/FP8).
    llm = LLM(args.model, device=args.device, dtype="float32", num_kv_pages=_KV_PAGES)
    data = make_sequences(llm, args.sequences, args.prompt_len, args.new_tokens, args.seed)
    held_out = make_sequences(llm, 8, args.prompt_len, args.new_tokens, args.seed + 1)
    # Gradients flow through the PyTorch attention path; the GPU kernels are inference-only.
    llm.engine.model.backend = TorchDsaBackend()
    if args.init == "identity":
        identity_init(llm)
    params = [p for name, p in llm.engine.model.named_parameters() if name.startswith("mtp.")]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        picks = torch.randint(len(data), (args.batch,), generator=gen).tolist()
        loss = mtp_loss(llm, [data[i] for i in picks])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % max(args.steps // 10, 1) == 0 or step == args.steps - 1:
            logger.info("step %d/%d loss %.3f", step + 1, args.steps, loss.item())
    save_distilled(llm, args.model, args.out)
    del llm, optimizer, params
    before = acceptance(args.model, held_out, args.device)
    after = acceptance(args.out, held_out, args.device)
    logger.info("draft acceptance on held-out prompts (2 steps): %.3f before, %.3f after", before, after)
    print(json.dumps({"out": str(args.out), "acceptance_before": before, "acceptance_after": after}))


if __name__ == "__main__":
    main()
