"""perf_analyzer --input-data JSON for the `dsa` ensemble, from the load generator's workload."""

from __future__ import annotations

import json
from pathlib import Path

from dsa_client.workload import Request


def perf_analyzer_data(requests: list[Request], stream: bool = True) -> dict:
    """One entry per request; output length fixed by min_tokens == max_tokens, greedy sampling."""
    return {"data": [{
        "text_input": [r.prompt],
        "max_tokens": [r.max_tokens],
        "min_tokens": [r.max_tokens],
        "temperature": [0.0],
        "stream": [stream],
        "exclude_input_in_output": [True],
    } for r in requests]}


def write_perf_analyzer_data(path: str | Path, requests: list[Request], stream: bool = True) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(perf_analyzer_data(requests, stream), indent=1, ensure_ascii=False), "utf-8")
    return path
