"""dsa_backend.serving.fill_template: the model repository filled for one checkpoint."""

from __future__ import annotations

import re

import pytest

from dsa_backend.serving.fill_template import MODELS, TEMPLATE_REPOSITORY, fill, main, parse_sets


def test_every_placeholder_is_filled(tokenizer_dir, tmp_path):
    out = fill(tokenizer_dir, tmp_path / "repo", {"page_size": "32", "num_kv_pages": "100"})
    for name in MODELS:
        config = (out / name / "config.pbtxt").read_text()
        assert "${" not in config, name
    llm = (out / "dsa_llm" / "config.pbtxt").read_text()
    assert f'string_value: "{tokenizer_dir.resolve()}"' in llm
    assert re.search(r'key: "page_size" value: \{ string_value: "32" \}', llm)
    assert (out / "dsa_llm" / "1" / "model.py").is_file()


def test_instance_kind_auto_is_cpu_without_a_gpu(tokenizer_dir, tmp_path):
    import torch

    llm = (fill(tokenizer_dir, tmp_path) / "dsa_llm" / "config.pbtxt").read_text()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert f"kind: {'KIND_CPU' if not gpus else 'KIND_GPU' if gpus == 1 else 'KIND_MODEL'}" in llm


def _placement(llm_config: str) -> tuple[str, str]:
    kind = re.search(r"kind: (\w+)", llm_config).group(1)
    dp = re.search(r'key: "data_parallel_size" value: \{ string_value: "(\w+)" \}', llm_config).group(1)
    return kind, dp


@pytest.mark.parametrize("gpus, sets, placement", [
    (0, {}, ("KIND_CPU", "1")),
    (1, {}, ("KIND_GPU", "1")),
    (8, {}, ("KIND_MODEL", "8")),                                  # a replica a GPU, in one instance
    (8, {"tensor_parallel_size": "2"}, ("KIND_MODEL", "4")),
    (8, {"tensor_parallel_size": "3"}, ("KIND_MODEL", "2")),       # the GPUs left over stay idle
    (8, {"data_parallel_size": "3"}, ("KIND_MODEL", "3")),
    (8, {"device": "cuda:4"}, ("KIND_MODEL", "1")),                # placed by hand: one engine
    (8, {"instance_kind": "KIND_GPU"}, ("KIND_GPU", "1")),         # an instance a GPU, each one engine
])
def test_data_parallel_auto_runs_an_engine_on_every_gpu_in_one_instance(tokenizer_dir, tmp_path, monkeypatch,
                                                                       gpus, sets, placement):
    from dsa_backend.serving import fill_template

    monkeypatch.setattr(fill_template, "_gpu_count", lambda: gpus)
    assert _placement((fill(tokenizer_dir, tmp_path, sets) / "dsa_llm" / "config.pbtxt").read_text()) == placement


def test_instance_kind_auto_with_tensor_parallelism_is_one_instance_over_its_gpus(tokenizer_dir, tmp_path):
    import torch

    llm = (fill(tokenizer_dir, tmp_path, {"tensor_parallel_size": "2"}) / "dsa_llm" / "config.pbtxt").read_text()
    assert ("kind: KIND_MODEL" if torch.cuda.is_available() else "kind: KIND_CPU") in llm
    assert re.search(r'key: "tensor_parallel_size" value: \{ string_value: "2" \}', llm)


def test_the_templates_hold_only_known_placeholders():
    from dsa_backend.serving.fill_template import DEFAULTS

    found = set()
    for name in MODELS:
        found |= set(re.findall(r"\$\{(\w+)\}", (TEMPLATE_REPOSITORY / name / "config.pbtxt").read_text()))
    assert found == set(DEFAULTS) | {"model_dir", "postprocessing_batching"}


def test_several_postprocessing_instances_keep_deltas_in_order(tokenizer_dir, tmp_path):
    one = (fill(tokenizer_dir, tmp_path / "one") / "postprocessing" / "config.pbtxt").read_text()
    two = (fill(tokenizer_dir, tmp_path / "two", {"postprocessing_instance_count": "2"})
           / "postprocessing" / "config.pbtxt").read_text()
    assert not any(line.startswith("dynamic_batching") for line in one.splitlines())
    assert "dynamic_batching { preserve_ordering: true }" in two


def test_unknown_parameter_is_refused(tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown template parameters"):
        fill(tokenizer_dir, tmp_path, {"pagesize": "32"})


def test_a_directory_without_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        fill(tmp_path, tmp_path / "repo")


def test_command_line_sets(tokenizer_dir, tmp_path, capsys):
    assert parse_sets(["a=1", "b = two"]) == {"a": "1", "b": "two"}
    with pytest.raises(SystemExit):
        main(["--model", str(tokenizer_dir), "--out", str(tmp_path), "--set", "page_size"])
    assert "key=value" in capsys.readouterr().err


def test_preprocessing_takes_every_input_of_the_ensemble_and_the_ensemble_passes_each():
    """So that any request reaches preprocessing's execute (and its error naming text_input): a
    request with none of its inputs fails in the server with "request has 0 inputs"."""
    declared = re.compile(r'\{ name: "(\w+)" (data_type: \w+ dims: \[[^\]]*\]) optional: true \}')
    ensemble = (TEMPLATE_REPOSITORY / "dsa" / "config.pbtxt").read_text()
    preprocessing = (TEMPLATE_REPOSITORY / "preprocessing" / "config.pbtxt").read_text()
    ensemble_inputs = dict(declared.findall(ensemble[:ensemble.index("output [")]))
    assert len(ensemble_inputs) > 20
    assert dict(declared.findall(preprocessing[:preprocessing.index("output [")])) == ensemble_inputs
    step = ensemble[ensemble.index('model_name: "preprocessing"'):ensemble.index('model_name: "dsa_llm"')]
    assert dict(re.findall(r'input_map \{ key: "(\w+)" value: "(\w+)" \}', step)) == {n: n for n in ensemble_inputs}
