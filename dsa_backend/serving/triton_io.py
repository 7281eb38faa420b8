"""Tensor I/O shared by the three python models; importable only inside the python backend stub.

The models are batched (max_batch_size > 0, as in tensorrtllm_backend, so clients that send a
[1, 1] text_input work unchanged) but serve one request per sequence: every input must have
batch size 1, and outputs get the batch dimension back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping

import numpy as np
import triton_python_backend_utils as pb_utils

logger = logging.getLogger(__name__)


def request_inputs(request, only: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """Every input of `request` (those named in `only`, when given) as an array without its batch
    dimension."""
    inputs = {}
    for tensor in request.inputs():
        name = tensor.name()
        if only is not None and name not in only:
            continue
        array = tensor.as_numpy()
        if array.ndim == 0 or array.shape[0] != 1:
            raise ValueError(f"{name} must have batch size 1 (one prompt per request), "
                             f"got shape {list(array.shape)}")
        inputs[name] = array[0]
    return inputs


def response(outputs: Mapping[str, np.ndarray]):
    """An InferenceResponse holding `outputs`, each given its batch dimension."""
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor(name, np.ascontiguousarray(array)[np.newaxis]) for name, array in outputs.items()])


def error_response(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def model_parameters(args: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as {key: string_value}, refusing fill_template placeholders."""
    config = json.loads(args["model_config"])
    params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
    unfilled = sorted(k for k, v in params.items() if v.startswith("${"))
    if unfilled:
        raise ValueError(f"model {config['name']}: parameters {unfilled} are not filled in; run "
                         "`python -m dsa_backend.serving.fill_template --model CHECKPOINT_DIR --out REPO`")
    return params
