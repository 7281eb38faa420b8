"""Serving test helpers: the engine settings of the served model, and reading its metrics."""

from __future__ import annotations

import re
import urllib.request

# Engine settings shared by the served model and the offline LLM that checks its text.
ENGINE = {"page_size": "16", "num_kv_pages": "64", "max_model_len": "512", "max_running_requests": "64"}


def engine_kwargs(settings: dict[str, str]) -> dict:
    return {"device": "cpu", "page_size": int(settings["page_size"]),
            "num_kv_pages": int(settings["num_kv_pages"]), "max_model_len": int(settings["max_model_len"]),
            "max_running_requests": int(settings["max_running_requests"])}


def read_metric(server, name: str, **labels: str) -> float | None:
    """The sum of the matching Prometheus samples on the server's metrics port; None if none match."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    total = None
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total = (total or 0.0) + float(m.group(3))
    return total
