"""experiments/shorter_budgets.py on a tiny run: each budget averages the checkpoints a run of that length would
have (brute force over the log), the average is the mean of those checkpoints, and missing checkpoints or a budget
longer than the run are refused before any decoding."""

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import tiny_run_overrides

from transformer_jax.errors import UsageError
from transformer_jax.experiment import load_experiment
from transformer_jax.train import loop
from transformer_jax.workdir import load_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import shorter_budgets  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """8 updates, validated and saved every 2, every checkpoint kept."""
    path = tmp_path_factory.mktemp("budgets")
    changes = {"train.eval_every": 2, "train.checkpoint_every": 2, "train.keep_checkpoints": 1, "train.keep_best": 10}
    changes |= {"train.bleu_every": 0, "optimizer.warmup_steps": 2, "optimizer.lr_scale": 4.0}
    loop.train(load_experiment("experiments/tiny.py", tiny_run_overrides(8, **changes)), path)
    return path


def eval_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "eval"]


def test_each_budget_averages_the_best_checkpoints_validated_by_then(run):
    evals = eval_rows(run)
    budget = (evals[1]["elapsed_s"] + evals[2]["elapsed_s"]) / 2 / 60  # between the validations at 4 and 6
    report = shorter_budgets.main([str(run), "--minutes", str(budget), "--best", "2", "--beam-size", "2"])

    short, full = report["budgets"]
    by_then = {row["step"]: row["perplexity"] for row in evals[:2]}
    assert short["last_validated"] == 4 and short["averaged"] == [2, 4]
    everything = {row["step"]: row["perplexity"] for row in evals}
    lowest = sorted(sorted(everything), key=lambda step: (everything[step], -step))[:2]  # brute force
    assert full["last_validated"] == 8 and full["averaged"] == sorted(lowest)
    assert short["best_validation_perplexity"] == pytest.approx(min(by_then.values()))

    averaged = load_params(run / "budgets" / f"{budget:g}min", "averaged")
    mean = jax.tree.map(lambda a, b: (np.float64(a) + np.float64(b)) / 2, load_params(run, 2), load_params(run, 4))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), averaged, mean)
    for budget_row in report["budgets"]:
        assert 0.0 <= budget_row["bleu_lowercase"] <= 100.0
    assert (run / "budgets" / "run" / "averaged").is_dir() and (run / "budgets" / "budgets.png").stat().st_size > 0


def test_refuses_missing_checkpoints_and_budgets_past_the_run(run, tmp_path):
    with pytest.raises(UsageError, match="lasted"):
        shorter_budgets.main([str(run), "--minutes", "600"])
    thinned = tmp_path / "thinned"
    for name in ("config.json", "spm.model", "metrics.jsonl"):
        (thinned / "checkpoints").mkdir(parents=True, exist_ok=True)
        (thinned / name).write_bytes((run / name).read_bytes())
    (thinned / "checkpoints" / "8").symlink_to(run / "checkpoints" / "8")
    first = eval_rows(run)[0]["elapsed_s"] / 60
    with pytest.raises(UsageError, match=r"lacks checkpoints \[2"):
        shorter_budgets.main([str(thinned), "--minutes", str(first + 1e-6)])
    assert not (thinned / "budgets").exists()  # refused before averaging or decoding anything
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_bytes((run / "metrics.jsonl").read_bytes())
    with pytest.raises(UsageError, match="checkpoints not found"):
        shorter_budgets.main([str(bare), "--minutes", str(first + 1e-6)])
