"""Where a benchmark writes its JSON: --out, or experiments/bench/results/{name}_{time}.json (ignored by git)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, payload: dict, out: str | Path | None = None) -> Path:
    """Writes `payload` as indented JSON and returns the path."""
    path = Path(out) if out else RESULTS / f"{name}_{datetime.datetime.now():%Y%m%d_%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    return path
