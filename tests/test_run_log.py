"""The run log, {workdir}/metrics.jsonl, read back from hand-written lines: a cut last line skipped, a damaged line
before it refused by file and line, a resumed run's repeated rows read once (the last), every kind at one step kept;
the writer's rows, and a cut tail removed before it appends."""

import json
import subprocess
import sys

import pytest

from transformer_jax import run_log
from transformer_jax.errors import UserError


def write_log(directory, text: str) -> None:
    (directory / "metrics.jsonl").write_text(text)  # the file name old workdirs have


def test_a_workdir_without_a_log_has_no_rows(tmp_path):
    assert run_log.read_rows(tmp_path) == []


def test_a_cut_last_line_is_skipped(tmp_path):
    write_log(
        tmp_path,
        '{"kind": "train", "step": 10, "elapsed_s": 5.0, "loss": 4.5}\n'
        '{"kind": "eval", "step": 10, "elapsed_s": 6.0, "perplexity": 80.0}\n'
        '{"kind": "train", "step": 20, "elapsed_s": 9.1, "lo',
    )
    assert run_log.read_rows(tmp_path) == [
        {"kind": "train", "step": 10, "elapsed_s": 5.0, "loss": 4.5},
        {"kind": "eval", "step": 10, "elapsed_s": 6.0, "perplexity": 80.0},
    ]


def test_a_damaged_line_before_the_last_is_refused_naming_the_file_and_line(tmp_path):
    write_log(
        tmp_path,
        '{"kind": "train", "step": 10, "elapsed_s": 5.0, "loss": 4.5}\n'
        '{"kind": "train", "step": 20, "elapsed_s": 9.1, "lo\n'
        '{"kind": "train", "step": 30, "elapsed_s": 13.2, "loss": 3.9}\n',
    )
    with pytest.raises(UserError, match=r"metrics\.jsonl, line 2: not a JSON row") as error:
        run_log.read_rows(tmp_path)
    assert isinstance(error.value, run_log.RunLogError) and str(tmp_path / "metrics.jsonl") in str(error.value)


def test_a_resumed_runs_repeated_rows_are_read_once_the_last_written_winning(tmp_path):
    # updates 0-30 logged, a checkpoint at 20, killed; resumed from 20: 30 and 40 logged again by the new command
    write_log(
        tmp_path,
        '{"kind": "machine", "step": 0, "elapsed_s": 0.5, "cpu": "A"}\n'
        '{"kind": "train", "step": 10, "elapsed_s": 5.0, "loss": 4.5}\n'
        '{"kind": "train", "step": 20, "elapsed_s": 9.0, "loss": 4.0}\n'
        '{"kind": "eval", "step": 20, "elapsed_s": 9.5, "perplexity": 60.0}\n'
        '{"kind": "train", "step": 30, "elapsed_s": 13.0, "loss": 3.8}\n'
        '{"kind": "machine", "step": 20, "elapsed_s": 0.4, "cpu": "B"}\n'
        '{"kind": "train", "step": 30, "elapsed_s": 4.0, "loss": 3.7}\n'
        '{"kind": "train", "step": 40, "elapsed_s": 8.0, "loss": 3.5}\n'
        '{"kind": "eval", "step": 40, "elapsed_s": 8.5, "perplexity": 40.0}\n',
    )
    rows = run_log.read_rows(tmp_path)
    assert [(row["kind"], row["step"], row["elapsed_s"]) for row in rows] == [
        ("machine", 0, 0.5),
        ("train", 10, 5.0),
        ("train", 20, 9.0),
        ("eval", 20, 9.5),
        ("machine", 20, 0.4),  # written after the first command's rows at update 20
        ("train", 30, 4.0),  # the resumed command's, not the first's (13.0)
        ("train", 40, 8.0),
        ("eval", 40, 8.5),
    ]
    assert rows[5]["loss"] == 3.7


def test_every_kind_logged_at_one_step_is_kept(tmp_path):
    kinds = ("train", "eval", "bleu", "final_bleu", "machine")
    write_log(tmp_path, "".join(json.dumps({"kind": kind, "step": 100, "elapsed_s": 1.0}) + "\n" for kind in kinds))
    assert [row["kind"] for row in run_log.read_rows(tmp_path)] == list(kinds)  # in the order written


def test_the_writer_appends_flushed_rows_and_ends_a_cut_tail_first(tmp_path):
    write_log(tmp_path, '{"kind": "train", "step": 10, "elapsed_s": 5.0}\n{"kind": "train", "step": 20, "ela')
    writer = run_log.RunLogWriter(tmp_path)
    writer.append("machine", 10, 0.123456, {"cpu": "B"})
    assert run_log.read_rows(tmp_path)[-1] == {"kind": "machine", "step": 10, "elapsed_s": 0.12, "cpu": "B"}  # flushed
    writer.append("train", 20, 4.0, {"loss": 3.5})
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [
        '{"kind": "train", "step": 10, "elapsed_s": 5.0}',
        '{"kind": "machine", "step": 10, "elapsed_s": 0.12, "cpu": "B"}',
        '{"kind": "train", "step": 20, "elapsed_s": 4.0, "loss": 3.5}',
    ]


def test_a_whole_last_row_without_its_newline_is_kept_by_the_writer(tmp_path):
    write_log(tmp_path, '{"kind": "train", "step": 10, "elapsed_s": 5.0}')
    writer = run_log.RunLogWriter(tmp_path)
    writer.append("train", 20, 9.0, {})
    writer.close()
    assert [row["step"] for row in run_log.read_rows(tmp_path)] == [10, 20]


def test_the_workdir_module_does_not_import_the_training_package():
    code = (
        "import sys, transformer_jax.workdir\n"
        "print(sorted(name for name in sys.modules if name.startswith('transformer_jax.train')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
