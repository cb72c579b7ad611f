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


def tiny_argv(workdir: Path, *, updates: int, bleu_sentences: int) -> list[str]:
    """The script's command line for a seconds-long comparison on the built-in corpus, evaluated every 2 updates."""
    overrides = tiny_run_overrides(
        **{"data.pack": False, "train.bleu_max_sentences": bleu_sentences, "data.max_eval_batches": 1}
    )
    argv = [
        "--config",
        "experiments/tiny.py",
        "--workdir",
        str(workdir),
        "--updates",
        str(updates),
        "--eval-every",
        "2",
    ]
    return argv + [f"--config.{key}={value}" for key, value in overrides]


def test_both_frameworks_train_and_are_evaluated_the_same_way(tmp_path, capsys):
    report = time_to_bleu.main(tiny_argv(tmp_path / "ttb", updates=4, bleu_sentences=8))
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


def test_a_second_call_keeps_the_finished_runs_and_refuses_other_settings(tmp_path, capsys, monkeypatch):
    argv = tiny_argv(tmp_path / "ttb", updates=2, bleu_sentences=4)
    first = time_to_bleu.main(argv)
    report_path = tmp_path / "ttb" / "time_to_bleu.json"
    jax_log = (tmp_path / "ttb" / "jax" / "metrics.jsonl").read_bytes()
    cut = json.loads(report_path.read_text())
    del cut["runs"]["torch eager"]  # as if torch's run had been cut short
    report_path.write_text(json.dumps(cut))

    again = time_to_bleu.main(argv)
    assert (tmp_path / "ttb" / "jax" / "metrics.jsonl").read_bytes() == jax_log  # JAX did not train again
    assert again["runs"]["jax"] == json.loads(json.dumps(first["runs"]["jax"]))  # its curve, read back
    assert again["first_batch_loss"] == first["first_batch_loss"]
    assert [step for _, step, _ in again["runs"]["torch eager"]["bleu"]] == [2]  # torch trained again

    with pytest.raises(SystemExit) as refused:
        time_to_bleu.main(tiny_argv(tmp_path / "ttb", updates=1, bleu_sentences=4))
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert "other settings" in error and "updates: 2 -> 1" in error

    monkeypatch.setattr(time_to_bleu, "cpu_model", lambda: "another CPU")
    with pytest.raises(SystemExit):
        time_to_bleu.main(argv)
    error = capsys.readouterr().err
    assert "other settings" in error and "-> 'another CPU'" in error  # two machines' runs are no comparison


def test_a_run_stopped_by_its_budget_counts_the_updates_of_its_last_evaluation(tmp_path):
    rows = [
        {"kind": "train", "step": 50, "elapsed_s": 60.0, "tokens_per_sec": 100.0},
        {"kind": "train", "step": 100, "elapsed_s": 120.0, "tokens_per_sec": 300.0},
        {"kind": "train", "step": 150, "elapsed_s": 180.0, "tokens_per_sec": 500.0},
        {"kind": "eval", "step": 157, "elapsed_s": 190.0, "perplexity": 6.5},  # the budget stopped it at 157
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    curve = time_to_bleu.curve_from_metrics(tmp_path)
    assert curve["updates"] == 157 and curve["perplexity"] == [(190.0 / 60, 157, 6.5)]
    assert curve["tokens_per_s"] == 400.0  # the median of the windows after the first (which compiles)


def test_torch_compile_batches_reports_the_pipelines_shapes_and_rates_from_its_timings(tmp_path, monkeypatch):
    import torch
    import torch_compile_batches

    from transformer_jax.experiment import load_experiment
    from transformer_jax.train import loop

    monkeypatch.setattr(torch, "compile", lambda model: model)  # the bookkeeping, without minutes of compiling
    overrides = tiny_run_overrides(**{"data.pack": False})
    argv = ["--config", "experiments/tiny.py", "--workdir", str(tmp_path / "tcb"), "--batches", "3", "--rounds", "1"]
    out = tmp_path / "tcb.json"
    report = torch_compile_batches.main(argv + [f"--config.{k}={v}" for k, v in overrides] + ["--out", str(out)])

    with loop.assemble(load_experiment("experiments/tiny.py", overrides), tmp_path / "tcb") as trainer:
        batches = [next(trainer.data.batches) for _ in range(3)]  # the same pipeline, read independently
    shapes = sorted({(b["inputs"].shape, b["targets"].shape) for b in batches})
    assert [tuple(map(tuple, shape)) for shape in report["shapes"]] == shapes
    tokens = sum(int((b["inputs"] != 0).sum() + (b["targets"] != 0).sum()) for b in batches)  # pad id 0
    eager, compiled = report["rows"]
    assert (eager["mode"], compiled["mode"]) == ("eager", "compile")
    for row in report["rows"]:
        assert row["graphs_compiled"] == 0  # torch.compile patched away: nothing went through dynamo
        assert row["tokens_per_s"] == pytest.approx(tokens / 3 / row["steady_s_per_update"])
    assert eager["eager_over_mode"] == 1.0
    assert compiled["eager_over_mode"] == pytest.approx(eager["steady_s_per_update"] / compiled["steady_s_per_update"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
