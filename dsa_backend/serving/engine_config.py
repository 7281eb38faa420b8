"""dsa_llm's config.pbtxt parameters -> EngineArgs, refusing bad settings with a message naming them.

Importable without Triton, so that the parsing is unit-tested; a ValueError raised here (or by the
Engine) in dsa_llm's initialize makes Triton fail to load the model and log the message.
"""

from __future__ import annotations

from dsa_backend.engine import FP8_WEIGHT_CHOICES, EngineArgs
from dsa_backend.replicas import check_routing
from dsa_backend.spec.config import SpecConfig

# An empty value (fill_template's default), "none" or "off" turns speculative decoding off.
_OFF = ("", "none", "None", "off")
# The speculative settings and the values that mean "not set" while speculation is off.
SPEC_DEFAULTS = {"speculative_num_steps": "1", "speculative_eagle_topk": "1", "speculative_num_draft_tokens": ""}


def engine_args(params: dict[str, str], device: str) -> EngineArgs:
    spec = speculative_settings(params)
    return EngineArgs(
        model=params["model_dir"], device=device, dtype=params.get("dtype", "auto"),
        page_size=_int(params, "page_size", "64"),
        num_kv_pages=_optional_int(params, "num_kv_pages"),
        kv_cache_dtype=params.get("kv_cache_dtype", "auto"),
        max_running_requests=_int(params, "max_running_requests", "64"),
        max_num_batched_tokens=_int(params, "max_num_batched_tokens", "2048"),
        max_model_len=_optional_int(params, "max_model_len"),
        batch_invariant=_bool(params, "batch_invariant", "false"),
        warmup=_bool(params, "warmup", "true"),
        warmup_threads=(None if params.get("warmup_threads", "auto").strip() in ("auto", "")
                        else _int(params, "warmup_threads", "")),
        cuda_graph=_bool(params, "cuda_graph", "true"),
        overlap_schedule=_bool(params, "overlap_schedule", "true"),
        fp8_weights=_choice(params, "fp8_weights", "auto", FP8_WEIGHT_CHOICES),
        enable_prefix_caching=_bool(params, "enable_prefix_caching", "true"),
        tensor_parallel_size=_int(params, "tensor_parallel_size", "1"),
        **spec)


def max_responses_per_s(params: dict[str, str]) -> float:
    """dsa_llm's limit on streamed responses a second, all requests together (0: none)."""
    value = params.get("max_responses_per_s", "1000").strip() or "0"
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not rate >= 0 or rate == float("inf"):
        raise ValueError(f"max_responses_per_s must be a number, 0 or more (0: no limit), got {value!r}")
    return rate


def data_parallel_size(params: dict[str, str]) -> int:
    """How many engines (replicas, each of tensor_parallel_size GPUs) dsa_llm runs."""
    size = _int(params, "data_parallel_size", "1")
    if size < 1:
        raise ValueError(f"data_parallel_size must be positive, got {size}")
    return size


def replica_routing(params: dict[str, str]) -> str:
    """How dsa_llm picks a replica for a request: prefix (where its prompt's first pages were
    sent, within a load margin) or least_busy (dsa_backend/replicas.py)."""
    return check_routing(params.get("replica_routing", "prefix").strip())


def max_queued_requests(params: dict[str, str]) -> int | None:
    """How many requests may wait for the engine before dsa_llm refuses new ones (None: no limit)."""
    limit = _optional_int(params, "max_queued_requests")
    if limit is not None and limit < 0:
        raise ValueError(f"max_queued_requests must be 0 or more, or none (no limit), got {limit}")
    return limit


def speculative_settings(params: dict[str, str]) -> dict:
    """EngineArgs' speculative_* fields; checked here already, before any weights are loaded."""
    algorithm = params.get("speculative_algorithm", "").strip()
    if algorithm in _OFF:
        set_anyway = [f"{k}={params[k]!r}" for k, off in SPEC_DEFAULTS.items()
                      if params.get(k, "").strip() not in (off, *_OFF)]
        if set_anyway:
            raise ValueError(f"{', '.join(set_anyway)} given, but speculative_algorithm is off (empty); "
                             "set speculative_algorithm=mtp (or eagle) or leave these at their defaults")
        return {"speculative_algorithm": None}
    spec = {"speculative_algorithm": algorithm,
            "speculative_num_steps": _int(params, "speculative_num_steps", "1"),
            "speculative_eagle_topk": _int(params, "speculative_eagle_topk", "1"),
            "speculative_num_draft_tokens": _optional_int(params, "speculative_num_draft_tokens")}
    # The engine's own checks (algorithm, num_steps in [1, 16], topk in [1, 16], num_draft_tokens
    # num_steps + 1 for a chain and in [2, 1 + num_steps * topk] for a tree), run now.
    SpecConfig(spec["speculative_algorithm"], spec["speculative_num_steps"], spec["speculative_eagle_topk"],
               spec["speculative_num_draft_tokens"])
    return spec


def _int(params: dict[str, str], key: str, default: str) -> int:
    value = params.get(key, default).strip()
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def _bool(params: dict[str, str], key: str, default: str) -> bool:
    value = params.get(key, default).strip().lower() or default
    if value not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value in ("true", "1", "yes", "on")


def _choice(params: dict[str, str], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = params.get(key, default).strip().lower() or default
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _optional_int(params: dict[str, str], key: str) -> int | None:
    value = params.get(key, "").strip()
    return None if value in _OFF else _int(params, key, "")
