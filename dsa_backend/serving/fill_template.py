"""Fill the model repository's ${...} placeholders for one checkpoint, into a copy.

    python -m dsa_backend.serving.fill_template --model CHECKPOINT_DIR --out REPO_DIR \
        [--set page_size=64 --set num_kv_pages=4096 ...]

As with tensorrtllm_backend's fill_template.py, users set model parameters here, never in code.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

TEMPLATE_REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
MODELS = ("dsa", "preprocessing", "dsa_llm", "postprocessing")
# Every placeholder users set, and its default; model_dir comes from --model, and
# postprocessing_batching follows from postprocessing_instance_count.
DEFAULTS = {
    "instance_kind": "auto",               # auto: KIND_GPU for one engine on one GPU, KIND_MODEL for more
    "device": "auto",
    "dtype": "auto",
    "page_size": "64",
    "num_kv_pages": "none",
    "kv_cache_dtype": "auto",
    "max_running_requests": "64",
    "max_num_batched_tokens": "2048",
    "max_model_len": "none",
    "batch_invariant": "false",
    "warmup": "true",                     # GPU: compile every step shape's kernels before ready
    "warmup_threads": "auto",             # threads compiling the warm-up's kernels; 0: one at a time
    "cuda_graph": "true",
    "overlap_schedule": "true",           # schedule step n + 1 while the GPU runs step n (no speculation)
    "fp8_weights": "auto",                # FP8 checkpoints: auto (keep on a GPU), keep, dequantize
    "enable_prefix_caching": "true",      # reuse the KV pages of prompts' cached prefixes
    "tensor_parallel_size": "1",          # GPUs sharing each layer, from the instance's GPU on
    "data_parallel_size": "auto",         # engines of tensor_parallel_size GPUs; auto: as many as the GPUs hold
    "replica_routing": "prefix",          # a request's replica: prefix (its cached prompt, within a load margin) or least_busy
    "shutdown_timeout_s": "10",
    "max_responses_per_s": "1000",        # dsa_llm's streamed responses a second, all requests (0: no limit)
    "max_queued_requests": "none",        # requests waiting for the engine before new ones are refused
    "speculative_algorithm": "",          # empty: no speculative decoding; mtp or eagle: the MTP layer drafts
    "speculative_num_steps": "1",
    "speculative_eagle_topk": "1",
    "speculative_num_draft_tokens": "",   # empty: num_steps + 1
    "preprocessing_instance_count": "1",
    "postprocessing_instance_count": "1",
}
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def fill(model_dir: str | Path, out: str | Path, values: dict[str, str] | None = None,
         models: tuple[str, ...] = MODELS, template: Path = TEMPLATE_REPOSITORY) -> Path:
    """Copy `models` from `template` to `out` with every placeholder filled; return `out`."""
    model_dir = Path(model_dir).resolve()
    if not (model_dir / "tokenizer.json").is_file():
        raise ValueError(f"--model {model_dir}: not a checkpoint directory (no tokenizer.json)")
    unknown = sorted(set(values or {}) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown template parameters {unknown}; known: {sorted(DEFAULTS)}")
    filled = {**DEFAULTS, **(values or {}), "model_dir": str(model_dir)}
    # KIND_GPU puts an instance on every GPU, and a request's abort or the drain would reach any of
    # them (dsa_backend/replicas.py); so unless one GPU is all there is, one KIND_MODEL instance holds
    # the engines, which take their GPUs from its device on (cuda:0 with device auto).
    gpus = _gpu_count()
    if filled["instance_kind"] == "auto":
        one_gpu = gpus == 1 and filled["tensor_parallel_size"].strip() in ("", "1")
        filled["instance_kind"] = "KIND_CPU" if not gpus else "KIND_GPU" if one_gpu else "KIND_MODEL"
    if filled["data_parallel_size"].strip() == "auto":
        filled["data_parallel_size"] = str(_replicas_on_every_gpu(filled, gpus))
    filled["postprocessing_batching"] = _postprocessing_batching(filled["postprocessing_instance_count"])
    if filled["instance_kind"] not in ("KIND_GPU", "KIND_CPU", "KIND_MODEL"):
        raise ValueError(f"instance_kind must be auto, KIND_GPU, KIND_CPU or KIND_MODEL, "
                         f"got {filled['instance_kind']!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in models:
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(template / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        config = target / "config.pbtxt"
        config.write_text(_PLACEHOLDER.sub(lambda m: filled[m.group(1)], config.read_text("utf-8")), "utf-8")
    logger.info("filled %s for %s into %s", ", ".join(models), model_dir, out)
    return out


def _postprocessing_batching(count: str) -> str:
    # Triton 2.51 ensembles forward deltas in the order postprocessing instances finish them.
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"postprocessing_instance_count must be a positive integer, got {count!r}")
    if int(count) == 1:
        return ""
    logger.warning("postprocessing_instance_count=%s: deltas stay ordered through dynamic batching, but "
                   "client cancellation no longer reaches the engine (the batcher drops cancelled "
                   "requests before postprocessing can pass them on)", count)
    return "dynamic_batching { preserve_ordering: true }"


def _replicas_on_every_gpu(filled: dict[str, str], gpus: int) -> int:
    """data_parallel_size=auto: the engines of tensor_parallel_size GPUs that the machine's GPUs
    hold, when one KIND_MODEL instance places them from cuda:0 (else 1)."""
    tp = filled["tensor_parallel_size"].strip()
    if gpus < 2 or filled["instance_kind"] != "KIND_MODEL" or filled["device"] != "auto" or not tp.isdigit():
        return 1
    return max(1, gpus // max(1, int(tp)))


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_sets(items: list[str]) -> dict[str, str]:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set takes key=value, got {item!r}")
        values[key.strip()] = value.strip()
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (config.json, weights, tokenizer)")
    parser.add_argument("--out", required=True, help="where to write the filled model repository")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"template parameter; known: {', '.join(sorted(DEFAULTS))}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        fill(args.model, args.out, parse_sets(args.set))
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
