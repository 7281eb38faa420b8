"""dsa_backend.serving.engine_config: dsa_llm's parameters -> EngineArgs, bad settings named."""

from __future__ import annotations

import pytest

from dsa_backend.serving.engine_config import (data_parallel_size, engine_args, max_queued_requests, max_responses_per_s,
                                               replica_routing)
from dsa_backend.serving.fill_template import DEFAULTS

# What fill_template writes by default (placeholders of dsa_llm's config.pbtxt).
FILLED = {**DEFAULTS, "model_dir": "/ckpt"}


def test_the_defaults_turn_speculation_off():
    args = engine_args(FILLED, "cpu")
    assert args.speculative_algorithm is None
    assert (args.model, args.device, args.num_kv_pages, args.max_model_len) == ("/ckpt", "cpu", None, None)


def test_tensor_parallel_size_reaches_the_engine_args_and_must_be_an_integer():
    assert engine_args(FILLED, "cpu").tensor_parallel_size == 1
    assert engine_args({**FILLED, "tensor_parallel_size": "8"}, "cpu").tensor_parallel_size == 8
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer"):
        engine_args({**FILLED, "tensor_parallel_size": "two"}, "cpu")


def test_speculative_settings_reach_the_engine_args():
    args = engine_args({**FILLED, "speculative_algorithm": "mtp", "speculative_num_steps": "3",
                        "speculative_num_draft_tokens": "4"}, "cpu")
    assert (args.speculative_algorithm, args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == ("mtp", 3, 1, 4)


def test_tree_settings_reach_the_engine_args():
    args = engine_args({**FILLED, "speculative_algorithm": "eagle", "speculative_num_steps": "3",
                        "speculative_eagle_topk": "2", "speculative_num_draft_tokens": "5"}, "cpu")
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 2, 5)


@pytest.mark.parametrize("settings, named", [
    ({"speculative_algorithm": "eagle", "speculative_eagle_topk": "17"}, "speculative_eagle_topk"),
    ({"speculative_algorithm": "eagle", "speculative_num_steps": "3", "speculative_eagle_topk": "2",
      "speculative_num_draft_tokens": "9"}, r"speculative_num_draft_tokens must be in \[2, 1 \+ speculative_num_steps"),
    ({"speculative_algorithm": "medusa"}, "speculative_algorithm"),
    ({"speculative_algorithm": "mtp", "speculative_num_steps": "17"}, "speculative_num_steps"),
    ({"speculative_algorithm": "mtp", "speculative_num_steps": "two"}, "speculative_num_steps"),
    ({"speculative_algorithm": "mtp", "speculative_num_steps": "2", "speculative_num_draft_tokens": "5"},
     "speculative_num_draft_tokens"),
    # set while speculation is off: a mistake, not silently ignored
    ({"speculative_eagle_topk": "2"}, "speculative_eagle_topk"),
    ({"speculative_num_steps": "3"}, "speculative_algorithm is off"),
    ({"page_size": "sixty"}, "page_size"),
])
def test_a_bad_setting_is_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=named):
        engine_args({**FILLED, **settings}, "cpu")


def test_batch_invariant_is_off_by_default_and_parsed_as_a_boolean():
    assert engine_args(FILLED, "cpu").batch_invariant is False
    assert engine_args({**FILLED, "batch_invariant": "true"}, "cpu").batch_invariant is True
    with pytest.raises(ValueError, match="batch_invariant must be true or false, got 'sometimes'"):
        engine_args({**FILLED, "batch_invariant": "sometimes"}, "cpu")


def test_fp8_weights_default_to_auto_and_bad_values_are_named():
    assert engine_args(FILLED, "cpu").fp8_weights == "auto"
    assert engine_args({**FILLED, "fp8_weights": "Dequantize"}, "cpu").fp8_weights == "dequantize"
    with pytest.raises(ValueError, match="fp8_weights must be one of auto, keep, dequantize; got 'bf16'"):
        engine_args({**FILLED, "fp8_weights": "bf16"}, "cpu")


def test_cuda_graphs_are_on_by_default_and_can_be_turned_off():
    assert engine_args(FILLED, "cpu").cuda_graph is True
    assert engine_args({**FILLED, "cuda_graph": "false"}, "cpu").cuda_graph is False
    with pytest.raises(ValueError, match="cuda_graph must be true or false, got 'maybe'"):
        engine_args({**FILLED, "cuda_graph": "maybe"}, "cpu")


def test_overlap_scheduling_is_on_by_default_and_can_be_turned_off():
    assert engine_args(FILLED, "cpu").overlap_schedule is True
    assert engine_args({**FILLED, "overlap_schedule": "false"}, "cpu").overlap_schedule is False
    with pytest.raises(ValueError, match="overlap_schedule must be true or false"):
        engine_args({**FILLED, "overlap_schedule": "sometimes"}, "cpu")


def test_warmup_is_on_by_default_and_can_be_turned_off():
    assert engine_args(FILLED, "cpu").warmup is True
    assert engine_args({**FILLED, "warmup": "false"}, "cpu").warmup is False
    with pytest.raises(ValueError, match="warmup must be true or false, got 'later'"):
        engine_args({**FILLED, "warmup": "later"}, "cpu")


def test_warmup_threads_are_auto_by_default_and_a_count_otherwise():
    assert engine_args(FILLED, "cpu").warmup_threads is None
    assert engine_args({**FILLED, "warmup_threads": "0"}, "cpu").warmup_threads == 0
    assert engine_args({**FILLED, "warmup_threads": "6"}, "cpu").warmup_threads == 6
    with pytest.raises(ValueError, match="warmup_threads must be an integer, got 'many'"):
        engine_args({**FILLED, "warmup_threads": "many"}, "cpu")


def test_prefix_caching_is_on_by_default_and_can_be_turned_off():
    assert engine_args(FILLED, "cpu").enable_prefix_caching is True
    assert engine_args({**FILLED, "enable_prefix_caching": "false"}, "cpu").enable_prefix_caching is False
    with pytest.raises(ValueError, match="enable_prefix_caching must be true or false"):
        engine_args({**FILLED, "enable_prefix_caching": "maybe"}, "cpu")


def test_max_responses_per_s_is_a_non_negative_number():
    assert max_responses_per_s({}) == float(DEFAULTS["max_responses_per_s"])
    assert max_responses_per_s({"max_responses_per_s": "0"}) == 0
    assert max_responses_per_s({"max_responses_per_s": " 1500 "}) == 1500
    for bad in ("-1", "fast", "inf", "nan"):
        with pytest.raises(ValueError, match="max_responses_per_s must be a number"):
            max_responses_per_s({"max_responses_per_s": bad})


def test_max_queued_requests_is_none_or_a_non_negative_integer():
    assert max_queued_requests(FILLED) is None
    assert max_queued_requests({"max_queued_requests": "0"}) == 0
    assert max_queued_requests({"max_queued_requests": " 256 "}) == 256
    for bad in ("-1", "many"):
        with pytest.raises(ValueError, match="max_queued_requests"):
            max_queued_requests({"max_queued_requests": bad})


def test_data_parallel_size_is_a_positive_integer():
    assert data_parallel_size({}) == 1
    assert data_parallel_size({"data_parallel_size": " 4 "}) == 4
    for bad in ("0", "-2", "two", "auto"):   # fill_template resolves auto; dsa_llm takes a count
        with pytest.raises(ValueError, match="data_parallel_size"):
            data_parallel_size({"data_parallel_size": bad})


def test_replica_routing_is_prefix_by_default_or_least_busy():
    assert replica_routing({}) == replica_routing(FILLED) == "prefix"
    assert replica_routing({"replica_routing": " least_busy "}) == "least_busy"
    with pytest.raises(ValueError, match="replica_routing must be one of prefix, least_busy; got 'round_robin'"):
        replica_routing({"replica_routing": "round_robin"})
