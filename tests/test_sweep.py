"""transformer-jax sweep: rows trained in their own workdirs, finished rows skipped, interrupted ones resumed, the
table built from what the runs logged; --dry-run commands and --collect for rows trained elsewhere."""

import json
import math
import os
import shlex
import signal
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import tiny_run_overrides

from transformer_jax import cli, machine, run_log, sweep
from transformer_jax import workdir as ckpt
from transformer_jax.experiment import ConfigError
from transformer_jax.sweep import SweepRow
from transformer_jax.train import loop

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny.py"
STEPS = 4


def write_sweep_file(path: Path, rows: str) -> Path:
    overrides = dict(tiny_run_overrides(steps=STEPS, **{"train.final_bleu": "beam", "train.eval_every": 2}))
    path.write_text(
        "from transformer_jax.sweep import Sweep, SweepRow\n\n"
        "def get_sweep():\n"
        f"    return Sweep(config={str(TINY)!r}, overrides={overrides!r}, title='two rows', rows=({rows}))\n"
    )
    return path


ROWS = "SweepRow('base', reference={'ppl': 4.92, 'bleu': 25.8}), SweepRow('A: h 1', {'model.num_heads': 1}, group='A')"


def metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_sweep_resumes_an_interrupted_row_skips_finished_ones_and_tabulates(tmp_path, capsys):
    sweep_file = write_sweep_file(tmp_path / "grid.py", ROWS)
    out = tmp_path / "runs"
    _, _, planned = sweep.plan(sweep_file, out)
    assert [row.workdir.name for row in planned] == ["base", "a-h-1"]
    interrupted = planned[1]  # trained to update 2 of 4, as if the job had been stopped there
    cut = interrupted.experiment.replace(train=interrupted.experiment.train.replace(steps=2))
    loop.train(cut, interrupted.workdir)

    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out)]) == 0
    resumed = [row["step"] for row in metrics(interrupted.workdir) if row["kind"] == "train"]
    assert resumed == [1, 2, 3, 4]  # continued from its checkpoint, not restarted

    results = json.loads((out / "table.json").read_text())
    assert [result["row"] for result in results] == ["base", "A: h 1"]
    for row, result in zip(planned, results):
        logged = {r["kind"]: r for r in metrics(row.workdir) if r["step"] == STEPS}
        assert result["ppl"] == pytest.approx(math.exp(logged["eval"]["nll"]), rel=1e-6)
        assert result["bleu"] == logged["final_bleu"]["bleu"] and logged["final_bleu"]["method"] == "beam"
        trained = ckpt.load_params(row.workdir)  # the oracle: the checkpoint's own arrays
        assert result["params"] == sum(np.size(leaf) for leaf in jax.tree.leaves(trained))
        assert result["updates"] == STEPS and result["train_minutes"] > 0
        assert result["cpu"] == machine.cpu_model()  # once, though the resumed row logged its machine twice
        validations = [(r["step"], math.exp(r["nll"])) for r in metrics(row.workdir) if r["kind"] == "eval"]
        curve = sweep.validation_curve(row.workdir)
        assert [step for step, _ in curve] == [step for step, _ in validations] == [2, 4]
        assert [ppl for _, ppl in curve] == pytest.approx([ppl for _, ppl in validations], rel=1e-6)
    assert results[0]["paper_ppl"] == 4.92 and "paper_ppl" not in results[1]
    table = (out / "table.md").read_text()
    assert table.startswith("# two rows") and "| A | A: h 1 | model.num_heads=1 |" in table and "4.92" in table
    assert (out / "table.png").stat().st_size > 0 and (out / "table.csv").read_text().count("\n") == 3
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    logs = [(row.workdir / "metrics.jsonl").read_bytes() for row in planned]
    capsys.readouterr()
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out)]) == 0
    assert capsys.readouterr().out.count("finished, skipped") == 2
    assert [(row.workdir / "metrics.jsonl").read_bytes() for row in planned] == logs  # nothing re-ran


def test_a_signal_stops_the_sweep_with_its_table_and_the_same_command_resumes_the_row(tmp_path, capsys, monkeypatch):
    sweep_file = write_sweep_file(tmp_path / "grid.py", ROWS)
    out = tmp_path / "runs"
    train = loop.train

    def train_with_sigterm_in_row_2(experiment, workdir, on_update=None):
        def send_sigterm(update, _):
            if Path(workdir).name == "a-h-1" and update == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # as a job scheduler's preemption would

        return train(experiment, workdir, send_sigterm)

    monkeypatch.setattr(loop, "train", train_with_sigterm_in_row_2)
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out)]) == 143
    said = capsys.readouterr().out
    assert "sweep row 'A: h 1' stopped by SIGTERM at update" in said and "rerun the same command" in said
    table = (out / "table.md").read_text()
    assert "| base | (base) |" in table and f"| A | A: h 1 | not finished ({out / 'a-h-1'}) |" in table

    monkeypatch.undo()
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out)]) == 0
    assert [row["step"] for row in metrics(out / "a-h-1") if row["kind"] == "train"] == [1, 2, 3, 4]  # resumed
    assert [result["row"] for result in json.loads((out / "table.json").read_text())] == ["base", "A: h 1"]


def test_a_row_stopped_before_scoring_its_last_update_is_scored_from_its_workdir_as_its_training_scores_it(
    tmp_path, monkeypatch
):
    sweep_file = write_sweep_file(tmp_path / "grid.py", "SweepRow('base'),")
    out = tmp_path / "runs"
    (row,) = sweep.plan(sweep_file, out)[2]
    loop.train(row.experiment, row.workdir)  # the oracle: the Trainer's own scores of its last update
    logged = metrics(row.workdir)
    scores = ("eval", "final_bleu")
    by_training = {r["kind"]: r for r in logged if r["step"] == STEPS and r["kind"] in scores}
    assert set(by_training) == set(scores) and by_training["final_bleu"]["method"] == "beam"
    # as if the job had been killed after the last checkpoint, before the run validated it
    cut = [r for r in logged if not (r["step"] == STEPS and r["kind"] in scores)]
    (row.workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cut))
    assembled = []
    assemble = loop.assemble
    monkeypatch.setattr(loop, "assemble", lambda *args, **kwargs: assembled.append(args) or assemble(*args, **kwargs))

    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out)]) == 0
    assert len(assembled) == 1  # the resumed run's, which had no update left: the scoring built no Trainer
    rescored = {r["kind"]: r for r in metrics(row.workdir)[len(cut) :] if r["kind"] in scores}
    for kind in scores:
        assert {**rescored[kind], "elapsed_s": 0} == {**by_training[kind], "elapsed_s": 0}, kind
    (result,) = json.loads((out / "table.json").read_text())
    assert (result["ppl"], result["bleu"]) == (by_training["eval"]["perplexity"], by_training["final_bleu"]["bleu"])


def test_a_rows_minutes_are_its_updates_at_the_median_seconds_per_update(tmp_path):
    logged = [  # (kind, step, elapsed_s) of three `train` commands, each resumed from a checkpoint (clock restarts)
        ("machine", 0, 0.0),
        ("train", 50, 50.0),
        ("train", 100, 90.0),
        ("train", 150, 1090.0),  # a paused window, then killed: resumed from the checkpoint at 100
        ("machine", 100, 0.0),
        ("train", 150, 100.0),
        ("train", 200, 140.0),
        ("machine", 200, 0.0),
        ("train", 250, 150.0),
    ]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": kind, "step": step, "elapsed_s": elapsed}) + "\n" for kind, step, elapsed in logged)
    )
    rows = run_log.read_rows(tmp_path)
    # windows of one command: 0.8, 0.8 s an update (the paused one was logged again); none across a resume
    # (90 -> 100 and 140 -> 150 s: 0.2 s an update)
    assert sweep.train_minutes(rows, 2000) == pytest.approx(2000 * 0.8 / 60)
    assert sweep.train_minutes(rows[:2], 2000) == 0.0


def test_the_table_gives_each_rows_perplexity_relative_to_the_first_rows_ours_and_the_papers(tmp_path):
    sweep_file = write_sweep_file(tmp_path / "grid.py", ROWS)
    the_sweep, _, planned = sweep.plan(sweep_file, tmp_path / "runs")
    base = {"group": "base", "row": "base", "ppl": 7.56, "bleu": 33.6, "paper_ppl": 4.92, "paper_bleu": 25.8}
    h1 = {"group": "A", "row": "A: h 1", "ppl": 7.64, "bleu": 33.8, "paper_ppl": 5.29, "paper_bleu": 24.9}
    for result, minutes in ((base, 27.3), (h1, 28.3)):
        result.update(updates=2000, train_minutes=minutes)
    table = sweep.write_table(the_sweep, planned, [base, h1], tmp_path / "out").read_text()
    # by hand: 7.64 / 7.56 = 1.0106, 5.29 / 4.92 = 1.0752; 33.8 - 33.6 = 0.2, 24.9 - 25.8 = -0.9
    assert "| 7.64 | +1.1% | 33.80 | +0.20 | 5.29 | +7.5% | 24.9 | -0.9 |" in table
    assert "| 7.56 | +0.0% | 33.60 | +0.00 | 4.92 | +0.0% | 25.8 | +0.0 |" in table
    assert table.endswith("\n2 of 2 rows finished: 4,000 updates, 55.6 train minutes in all.\n")  # 27.3 + 28.3
    saved = json.loads((tmp_path / "out" / "table.json").read_text())
    assert saved[1]["ppl_change"] == pytest.approx(0.010582, abs=1e-6)
    assert saved[1]["paper_ppl_change"] == pytest.approx(0.075203, abs=1e-6)
    assert saved[1]["bleu_change"] == pytest.approx(0.2) and saved[1]["paper_bleu_change"] == pytest.approx(-0.9)

    unfinished_base = sweep.write_table(the_sweep, planned, [None, h1], tmp_path / "later").read_text()
    assert "| base | not finished" in unfinished_base and "vs row 1" not in unfinished_base
    assert "1 of 2 rows finished: 2,000 updates, 28.3 train minutes in all." in unfinished_base
    assert not (tmp_path / "later" / "table.png").exists()


def test_a_row_that_did_not_train_is_cut_at_the_scale_of_the_rows_that_did():
    # perplexity changes in %: the base, two variations, a row at 1,275x the base's perplexity (C: N 6 did)
    changes, off_scale = [0.0, 1.0, -3.0, 127_400.0], [False, False, False, True]
    assert sweep.plot_limit(changes, off_scale) == pytest.approx(1.2 * 3.0)
    assert sweep.plot_limit([0.0, 5.0], [False, True]) == 1.0  # nothing on the scale but row 1 itself


def test_dry_run_commands_train_rows_elsewhere_and_collect_tabulates_them(tmp_path, capsys):
    sweep_file = write_sweep_file(tmp_path / "grid.py", ROWS)
    out = tmp_path / "runs"
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out), "--dry-run"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 2 and not out.exists()
    words = shlex.split(commands[1])
    assert words[:2] == ["transformer-jax", "train"] and "--config.model.num_heads=1" in words
    assert cli.main(words[1:]) == 0  # the second row, as a separate job would run it

    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out), "--collect"]) == 0
    printed = capsys.readouterr().out
    assert "| base | not finished" in printed and "1 rows not finished" in printed
    results = json.loads((out / "table.json").read_text())
    assert [result["row"] for result in results] == ["A: h 1"] and results[0]["ppl"] > 1


def test_rows_run_only_the_named_rows_and_the_table_keeps_every_row_and_row_1_as_the_reference(
    tmp_path, capsys, monkeypatch
):
    sweep_file = write_sweep_file(tmp_path / "grid.py", ROWS)
    out = tmp_path / "runs"
    tables = []
    write_table = sweep.write_table
    monkeypatch.setattr(sweep, "write_table", lambda *a: tables.append(a[2]) or write_table(*a))
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out), "--rows", "a-h-1"]) == 0
    assert not (out / "base").exists()  # not chosen, not trained
    table = (out / "table.md").read_text()
    assert "| base | not finished" in table and "| A | A: h 1 |" in table and "vs row 1" not in table
    assert len(tables) == 2 and tables[0][1] is not None  # written once the row had finished, and at the end

    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out), "--rows", "base"]) == 0
    results = json.loads((out / "table.json").read_text())
    assert [result["row"] for result in results] == ["base", "A: h 1"]
    assert results[1]["ppl_change"] == pytest.approx(results[1]["ppl"] / results[0]["ppl"] - 1)

    assert cli.main(["sweep", str(sweep_file), "--workdir", str(out), "--rows", "A: h 2"]) == 2
    assert "--rows ['A: h 2']: no such row" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows, message",
    [
        ("SweepRow('x'), SweepRow('X')", "distinct"),
        ("SweepRow('base'), SweepRow('typo', {'model.num_head': 1})", "sweep row 'typo'"),
        ("SweepRow('base'), SweepRow('timed', {'train.max_minutes': 5})", "'timed' has train.max_minutes=5"),
    ],
)
def test_a_bad_sweep_file_is_refused_before_any_work(tmp_path, capsys, rows, message):
    sweep_file = write_sweep_file(tmp_path / "grid.py", rows)
    assert cli.main(["sweep", str(sweep_file), "--workdir", str(tmp_path / "runs")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["sweep", "train"])
def test_a_file_with_a_syntax_error_is_one_line_naming_it(tmp_path, capsys, command):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config():\n    return Experiment(\n")
    args = ["sweep", str(broken)] if command == "sweep" else ["train", "--config", str(broken)]
    assert cli.main([*args, "--workdir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and f"{broken}, line 2:" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_rows_may_be_named_by_names_that_hold_commas():
    names = ["A: h 8", "A: h 8, d_k 16", "B: d_k 8"]
    planned = [SimpleNamespace(row=SweepRow(name)) for name in names]
    chosen = sweep.select(planned, "B: d_k 8, A: h 8, d_k 16,a-h-8,,A: h 8")
    assert [row.row.name for row in chosen] == ["B: d_k 8", "A: h 8, d_k 16", "A: h 8", "A: h 8"]
    with pytest.raises(ConfigError, match=r"--rows \['d_k 32'\]: no such row.*'A: h 8, d_k 16' \(a-h-8-d-k-16\)"):
        sweep.select(planned, "A: h 8, d_k 32")
