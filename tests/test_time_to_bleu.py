"""experiments/bench/time_to_bleu.py on the built-in corpus: both frameworks train on the same batches from the
same weights, both curves are written, and the first batch's loss agrees between JAX and torch (no timing is
asserted)."""

import json
import sys
from pathlib import Path

import pytest
from conftest import tiny_run_overrides

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "bench"))

import time_to_bleu  # noqa: E402


def test_both_frameworks_train_and_are_evaluated_the_same_way(tmp_path, capsys):
    overrides = tiny_run_overrides(**{"data.pack": False, "train.bleu_max_sentences": 8, "data.max_eval_batches": 1})
    argv = [
        "--config",
        "experiments/tiny.py",
        "--workdir",
        str(tmp_path / "ttb"),
        "--updates",
        "4",
        "--eval-every",
        "2",
    ]
    report = time_to_bleu.main(argv + [f"--config.{key}={value}" for key, value in overrides])
    parity = report["first_batch_loss"]
    assert parity["torch"] == pytest.approx(parity["jax"], rel=1e-5) and parity["jax"] > 1.0
    for name in ("jax", "torch eager"):
        curve = report["runs"][name]
        assert curve["updates"] == 4
        assert [step for _, step, _ in curve["bleu"]] == [2, 4] and [step for _, step, _ in curve["perplexity"]] == [
            2,
            4,
        ]
        assert all(minutes > 0 and 0 <= bleu <= 100 for minutes, _, bleu in curve["bleu"])
    # the same data and weights: after 2 updates the two perplexities are close (dropout masks differ)
    jax_ppl, torch_ppl = (report["runs"][name]["perplexity"][0][2] for name in ("jax", "torch eager"))
    assert torch_ppl == pytest.approx(jax_ppl, rel=0.05)
    assert json.loads((tmp_path / "ttb" / "time_to_bleu.json").read_text())["first_batch_loss"] == parity
    assert (tmp_path / "ttb" / "time_to_bleu.png").stat().st_size > 0
    assert "first-batch loss" in capsys.readouterr().out
