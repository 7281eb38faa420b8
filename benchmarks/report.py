"""The end of every benchmark script: the result as one JSON line, and in a file if asked."""

from __future__ import annotations

import json


def emit(result: dict, path: str | None) -> None:
    print(json.dumps(result))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
