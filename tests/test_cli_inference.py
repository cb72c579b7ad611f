"""translate / evaluate / average / export-torch / import-torch on a real (tiny) trained workdir."""

import io
import json
import sys

import jax
import numpy as np
import pytest
import sacrebleu

from conftest import tiny_run_overrides
from transformer_jax import checkpoint as ckpt
from transformer_jax import cli
from transformer_jax.train import loop
from transformer_jax.translate import Translator

SOURCES = ["three small red cats", "", "the 3rd of May 2021", "I think that the dog sees the cat"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trained")
    config = cli.load_experiment("experiments/tiny.py", tiny_run_overrides(steps=9))
    loop.train(config, directory)
    return directory


def run_cli(argv, stdin="", monkeypatch=None, capsys=None):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_average_is_the_mean_of_the_last_checkpoints(workdir, monkeypatch, capsys):
    code, out, _ = run_cli(["average", "--workdir", str(workdir), "--last", "2"], monkeypatch=monkeypatch,
                           capsys=capsys)
    assert code == 0 and "[6, 9]" in out
    averaged = ckpt.load_params(workdir, "averaged")
    six, nine = ckpt.load_params(workdir, 6), ckpt.load_params(workdir, 9)
    expected = jax.tree.map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b, np.float64)) / 2, six, nine)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7), averaged, expected)
    assert json.loads((workdir / "averaged.json").read_text()) == {"steps": [6, 9]}


def test_translate_keeps_order_and_empty_lines_and_batches_like_single_sentences(workdir, monkeypatch, capsys):
    code, out, _ = run_cli(["translate", "--workdir", str(workdir), "--greedy", "--batch-size", "2"],
                           stdin="\n".join(SOURCES) + "\n", monkeypatch=monkeypatch, capsys=capsys)
    lines = out.split("\n")[:-1]
    assert code == 0 and len(lines) == len(SOURCES) and lines[1] == ""
    translator = Translator.from_workdir(workdir, method="greedy", batch_size=1)
    alone = [translator.translate([source])[0] for source in SOURCES]
    assert lines == alone


def test_too_long_input_is_truncated_with_a_warning_or_refused(workdir, monkeypatch, capsys, caplog):
    long_line = " ".join(["seventy-seven"] * 40)  # far more than max_len=32 pieces
    code, out, _ = run_cli(["translate", "--workdir", str(workdir), "--greedy"], stdin=long_line + "\n",
                           monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and len(out.split("\n")) == 2
    assert "more than the model's max_len=32; truncated" in caplog.text
    code, out, err = run_cli(["translate", "--workdir", str(workdir), "--greedy", "--on-too-long", "error"],
                             stdin="a cat\n" + long_line + "\n", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and "input line 2 has" in err and "max_len=32" in err and out == ""


def test_evaluate_scores_with_sacrebleu(workdir, tmp_path, monkeypatch, capsys):
    sources, references = tmp_path / "src.en", tmp_path / "ref.de"
    sources.write_text("three small red cats\nthe 3rd of May 2021\n")
    references.write_text("drei kleine rote Katzen\nder 3. Mai 2021\n")
    code, out, _ = run_cli(["evaluate", "--workdir", str(workdir), "--beam-size", "2", "--source-file",
                            str(sources), "--reference-file", str(references)], monkeypatch=monkeypatch,
                           capsys=capsys)
    assert code == 0 and "nrefs:1|case:mixed|eff:no|tok:13a" in out and "case:lc" in out
    result = json.loads((workdir / "eval" / "src.latest.beam2-alpha0.6.json").read_text())
    hypotheses = (workdir / "eval" / "src.latest.beam2-alpha0.6.txt").read_text().splitlines()
    refs = [["drei kleine rote Katzen", "der 3. Mai 2021"]]
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, refs).score)
    assert result["bleu_lowercase"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, refs).score)


def test_evaluate_refuses_mismatched_files(workdir, tmp_path, monkeypatch, capsys):
    sources, references = tmp_path / "a.en", tmp_path / "b.de"
    sources.write_text("one\ntwo\n")
    references.write_text("eins\n")
    code, _, err = run_cli(["evaluate", "--workdir", str(workdir), "--source-file", str(sources),
                            "--reference-file", str(references)], monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and "has 2 lines but" in err and "has 1" in err


def test_torch_export_and_import_round_trip(workdir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    exported = tmp_path / "model.pt"
    code, _, _ = run_cli(["export-torch", "--workdir", str(workdir), "--output", str(exported)],
                         monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and exported.stat().st_size > 0
    code, _, _ = run_cli(["import-torch", "--workdir", str(workdir), "--input", str(exported)],
                         monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    jax.tree.map(np.testing.assert_array_equal, ckpt.load_params(workdir, "imported"), ckpt.load_params(workdir))


def test_unknown_checkpoint_names_the_choices(workdir):
    with pytest.raises(ValueError, match=r"use a step number, one of \('averaged', 'imported'\)"):
        ckpt.load_params(workdir, "best")
    with pytest.raises(FileNotFoundError, match="No checkpoint at step 4"):
        ckpt.load_params(workdir, 4)
