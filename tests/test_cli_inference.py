"""translate / evaluate / average / export-torch / import-torch on a real (tiny) trained workdir."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import sacrebleu
from conftest import tiny_run_overrides

from transformer_jax import cli
from transformer_jax import workdir as ckpt
from transformer_jax.experiment import load_experiment
from transformer_jax.train import loop
from transformer_jax.translate import Translator

SOURCES = ["three small red cats", "", "the 3rd of May 2021", "I think that the dog sees the cat"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trained")
    config = load_experiment("experiments/tiny.py", tiny_run_overrides(steps=9))
    loop.train(config, directory)
    return directory


def run_cli(argv, stdin="", monkeypatch=None, capsys=None):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_average_is_the_mean_of_the_last_checkpoints(workdir, monkeypatch, capsys):
    code, out, _ = run_cli(
        ["average", "--workdir", str(workdir), "--last", "2"], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 0 and "[6, 9]" in out
    averaged = ckpt.load_params(workdir, "averaged")
    six, nine = ckpt.load_params(workdir, 6), ckpt.load_params(workdir, 9)
    expected = jax.tree.map(lambda a, b: (np.asarray(a, np.float64) + np.asarray(b, np.float64)) / 2, six, nine)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7), averaged, expected)
    assert json.loads((workdir / "averaged.json").read_text()) == {"steps": [6, 9]}


def test_translate_keeps_order_and_empty_lines_and_batches_like_single_sentences(workdir, monkeypatch, capsys):
    code, out, _ = run_cli(
        ["translate", "--workdir", str(workdir), "--greedy", "--batch-size", "2"],
        stdin="\n".join(SOURCES) + "\n",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    lines = out.split("\n")[:-1]
    assert code == 0 and len(lines) == len(SOURCES) and lines[1] == ""
    translator = Translator.from_workdir(workdir, method="greedy", batch_size=1)
    alone = [translator.translate([source])[0] for source in SOURCES]
    assert lines == alone


def test_too_long_input_is_truncated_with_a_warning_or_refused(workdir, monkeypatch, capsys, caplog):
    long_line = " ".join(["seventy-seven"] * 40)  # far more than max_len=32 pieces
    code, out, _ = run_cli(
        ["translate", "--workdir", str(workdir), "--greedy"],
        stdin=long_line + "\n",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 0 and len(out.split("\n")) == 2
    assert "more than the model's max_len=32; truncated" in caplog.text
    code, out, err = run_cli(
        ["translate", "--workdir", str(workdir), "--greedy", "--on-too-long", "error"],
        stdin="a cat\n" + long_line + "\n",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 1 and "input line 2 has" in err and "max_len=32" in err
    assert len(out.splitlines()) == 1  # the line before the refused one was translated and written


def test_evaluate_scores_with_sacrebleu(workdir, tmp_path, monkeypatch, capsys):
    sources, references = tmp_path / "src.en", tmp_path / "ref.de"
    sources.write_text("three small red cats\nthe 3rd of May 2021\n")
    references.write_text("drei kleine rote Katzen\nder 3. Mai 2021\n")
    code, out, _ = run_cli(
        [
            "evaluate",
            "--workdir",
            str(workdir),
            "--beam-size",
            "2",
            "--source-file",
            str(sources),
            "--reference-file",
            str(references),
        ],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 0 and "nrefs:1|case:mixed|eff:no|tok:13a" in out and "case:lc" in out
    result = json.loads((workdir / "eval" / "src.latest.beam2-alpha0.6.json").read_text())
    hypotheses = (workdir / "eval" / "src.latest.beam2-alpha0.6.txt").read_text().splitlines()
    refs = [["drei kleine rote Katzen", "der 3. Mai 2021"]]
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, refs).score)
    assert result["bleu_lowercase"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, refs).score)


def test_evaluate_refuses_an_unknown_split_in_one_line(workdir, monkeypatch, capsys):
    code, _, err = run_cli(
        ["evaluate", "--workdir", str(workdir), "--split", "test_2016_flickr"], "", monkeypatch, capsys
    )
    assert code == 2 and "--split test_2016_flickr" in err and "validation" in err and "Traceback" not in err


def test_evaluate_refuses_mismatched_files(workdir, tmp_path, monkeypatch, capsys):
    sources, references = tmp_path / "a.en", tmp_path / "b.de"
    sources.write_text("one\ntwo\n")
    references.write_text("eins\n")
    code, _, err = run_cli(
        ["evaluate", "--workdir", str(workdir), "--source-file", str(sources), "--reference-file", str(references)],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 1 and "has 2 lines but" in err and "has 1" in err


def test_torch_export_and_import_round_trip(workdir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    exported = tmp_path / "model.pt"
    code, _, _ = run_cli(
        ["export-torch", "--workdir", str(workdir), "--output", str(exported)], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 0 and exported.stat().st_size > 0
    code, _, _ = run_cli(
        ["import-torch", "--workdir", str(workdir), "--input", str(exported)], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 0
    jax.tree.map(np.testing.assert_array_equal, ckpt.load_params(workdir, "imported"), ckpt.load_params(workdir))


def test_unknown_checkpoint_names_the_choices(workdir, monkeypatch, capsys):
    code, _, err = run_cli(
        ["evaluate", "--workdir", str(workdir), "--checkpoint", "final", "--split", "test"],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 1 and "Traceback" not in err
    assert "checkpoint 'final' is not one: use a step number, 'latest', 'best' or one of ('averaged'" in err
    newest = max(int(path.name) for path in (workdir / "checkpoints").iterdir() if path.name.isdigit())
    jax.tree.map(np.testing.assert_array_equal, ckpt.load_params(workdir, "latest"), ckpt.load_params(workdir, newest))
    with pytest.raises(FileNotFoundError, match="No checkpoint at step 4"):
        ckpt.load_params(workdir, 4)


def test_translate_files_nbest_jsonl_and_token_batches(workdir, tmp_path, monkeypatch, capsys):
    """--input/--output, --nbest with scores against beam_search itself, --max-tokens giving the same output."""
    from transformer_jax.decoding import DecodeConfig

    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    code, out, _ = run_cli(
        [
            "translate",
            "--workdir",
            str(workdir),
            "--input",
            str(source),
            "--output",
            str(output),
            "--nbest",
            "3",
            "--beam-size",
            "3",
            "--format",
            "jsonl",
            "--max-tokens",
            "40",
        ],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 0 and out == ""
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["source"] for row in rows] == SOURCES
    translator = Translator.from_workdir(workdir, decode_config=DecodeConfig(beam_size=3), batch_size=1)
    for row, source_line in zip(rows, SOURCES):
        if not source_line:
            assert row["hypotheses"] == [{"text": "", "score": 0.0}]
            continue
        expected = translator.translate_nbest([source_line], nbest=3)[0]
        assert [h["text"] for h in row["hypotheses"]] == [h.text for h in expected]
        np.testing.assert_allclose([h["score"] for h in row["hypotheses"]], [h.score for h in expected], rtol=1e-5)
        scores = [h["score"] for h in row["hypotheses"]]
        assert scores == sorted(scores, reverse=True)  # best first


def test_translate_reports_bad_bytes_after_translating_the_lines_before(workdir, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO(b"three small red cats\nbad \xff byte\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    code = cli.main(["translate", "--workdir", str(workdir), "--greedy"])
    out, err = capsys.readouterr()
    assert code == 1 and len(out.splitlines()) == 1  # the good line came out
    assert "line 2 is not UTF-8" in err and "iconv -f" in err and "Traceback" not in err


def test_version_and_module_entry_point():
    import subprocess

    from transformer_jax import __version__

    proc = subprocess.run([sys.executable, "-m", "transformer_jax", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"transformer-jax {__version__}"


def test_load_gives_a_ready_translator(workdir):
    import transformer_jax

    translator = transformer_jax.load(workdir, method="greedy")
    assert translator.translate(["three small red cats"]) == Translator.from_workdir(
        workdir, method="greedy"
    ).translate(["three small red cats"])
    assert set(translator.params) >= {"embed", "encoder", "decoder"}


@pytest.mark.parametrize("last", ["0", "-2"])
def test_average_refuses_a_non_positive_count(workdir, last, monkeypatch, capsys):
    code, _, err = run_cli(
        ["average", "--workdir", str(workdir), "--last", last], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 2 and "--last" in err


def test_search_speed_benchmark_runs_on_a_trained_workdir(workdir, tmp_path, capsys):
    """experiments/bench/search_speed.py cannot rot: it runs on this workdir (no timing is asserted)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "bench"))
    import search_speed

    source, reference, out = tmp_path / "source.en", tmp_path / "reference.de", tmp_path / "search.json"
    source.write_text("\n".join(SOURCES) + "\n")
    reference.write_text("\n".join(["drei kleine rote katzen", "", "der 3. mai 2021", "ich denke"]) + "\n")
    argv = ["--workdir", str(workdir), "--source", str(source), "--reference", str(reference), "--beams", "1,2"]
    search_speed.main(argv + ["--repeats", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    methods = ["greedy", "beam 2"]
    assert [(row["engine"], row["method"]) for row in rows[:2]] == [("transformer_jax", m) for m in methods]
    assert rows[1]["decode"]["beam_size"] == 2
    ctranslate2_rows = [(row["engine"].split()[-1], row["method"]) for row in rows[2:]]
    searches = methods + ["beam 2 GNMT re-ranked"]
    assert ctranslate2_rows == [(q, m) for q in ("float32", "int8") for m in searches]
    assert all(row["sentences_per_s"] > 0 and 0 <= row["bleu_lc"] <= 100 for row in rows)
    assert all(0 <= row["same_as_project"] <= len(SOURCES) for row in rows[2:])
    assert "GNMT re-ranked" in capsys.readouterr().out


def test_average_refuses_a_fraction_outside_the_run(workdir, monkeypatch, capsys):
    code, _, err = run_cli(
        ["average", "--workdir", str(workdir), "--from-fraction", "2"], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 2 and "--from-fraction 2.0" in err


def test_average_on_a_missing_workdir_creates_nothing(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nothing-here"
    code, _, err = run_cli(["average", "--workdir", str(missing)], monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and "not found" in err and not missing.exists()


def test_workdir_problems_fail_at_once_and_write_nothing(workdir, tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code, _, err = run_cli(
        ["train", "--config", "experiments/tiny.py", "--workdir", str(a_file)], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 1 and "is a file" in err
    code, _, err = run_cli(
        ["train", "--config", "experiments/tiny.py", "--workdir", "gs://bucket/run"],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 1 and "remote paths" in err and not Path("gs:").exists()
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root may write anywhere: let the permission check see what a user would
        real_access = os.access
        monkeypatch.setattr(
            os, "access", lambda path, mode: False if Path(path) == read_only else real_access(path, mode)
        )
    for command in (
        ["average"],
        ["import-torch", "--input", "model.pt"],
        ["evaluate", "--source-file", "a", "--reference-file", "b"],
    ):
        code, _, err = run_cli(
            [command[0], "--workdir", str(read_only), *command[1:]], monkeypatch=monkeypatch, capsys=capsys
        )
        assert code == 1 and "not writable" in err, command
    assert list(read_only.iterdir()) == []  # nothing written


def test_evaluate_with_empty_files_says_so(workdir, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run_cli(
        [
            "evaluate",
            "--workdir",
            str(workdir),
            "--source-file",
            str(empty),
            "--reference-file",
            str(empty),
            "--greedy",
        ],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 1 and "no sentence pairs" in err and "Traceback" not in err


def test_translate_into_a_closed_pipe_stops_quietly(workdir):
    import subprocess

    lines = "three small red cats\n" * 200
    command = (
        f"set -o pipefail; {sys.executable} -m transformer_jax --compilation-cache off translate "
        f"--workdir {workdir} --greedy --chunk-lines 1 | head -1"
    )
    proc = subprocess.run(["bash", "-c", command], input=lines, capture_output=True, text=True, timeout=300)
    assert len(proc.stdout.splitlines()) == 1
    assert proc.returncode == 141 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_print_config_refuses_invalid_values(monkeypatch, capsys):
    code, out, err = run_cli(
        [
            "train",
            "--config",
            "experiments/tiny.py",
            "--workdir",
            "unused",
            "--print-config",
            "--config.train.label_smoothing=1.5",
        ],
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 2 and "label_smoothing" in err and out == ""


def test_evaluate_a_split_needs_only_that_split(tmp_path):
    """`evaluate --split test` reads the run's data section for the test files only (the train files may be gone)."""
    from transformer_jax.data.sources import source_from_config
    from transformer_jax.experiment import DataConfig

    for lang in ("en", "de"):
        (tmp_path / f"test_2016_flickr.{lang}").write_text("three small red cats\n")
    data = DataConfig(source="multi30k", path=str(tmp_path), source_lang="en", target_lang="de")
    source = source_from_config(data, splits=("test",))
    assert list(source.pairs("test")) == [("three small red cats", "three small red cats")]
    with pytest.raises(FileNotFoundError, match="train"):
        source_from_config(data)  # training needs them, and says which is missing


def test_import_torch_of_a_file_that_is_not_a_state_dict(workdir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a checkpoint\n")
    code, _, err = run_cli(
        ["import-torch", "--workdir", str(workdir), "--input", str(bogus)], monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 1 and "not a state_dict file written by torch.save" in err
    assert "weights_only=False" not in err and "Traceback" not in err


def test_sampling_draws_by_line_number_whatever_the_batching(workdir, tmp_path, monkeypatch, capsys):
    """--sample: each line's samples depend on the seed and its line number only, not on batches or chunks."""
    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    common = ["translate", "--workdir", str(workdir), "--input", str(source), "--sample", "--num-samples", "3"]
    common += ["--nbest", "3", "--format", "jsonl", "--top-p", "0.9", "--seed", "2"]
    runs = [
        run_cli(common + options, monkeypatch=monkeypatch, capsys=capsys)
        for options in (["--batch-size", "8"], ["--batch-size", "1", "--chunk-lines", "1"])
    ]
    assert [code for code, _, _ in runs] == [0, 0]
    batched, alone = ([json.loads(line) for line in out.splitlines()] for _, out, _ in runs)
    assert [len(row["hypotheses"]) for row in batched] == [3, 1, 3, 3]
    texts = [[h["text"] for h in row["hypotheses"]] for row in batched]
    assert texts == [[h["text"] for h in row["hypotheses"]] for row in alone]
    for mine, theirs in zip(batched, alone):  # the same draws; the scores' sums round by batch shape
        np.testing.assert_allclose(
            [h["score"] for h in mine["hypotheses"]], [h["score"] for h in theirs["hypotheses"]], rtol=1e-5
        )
    other = run_cli(common[:-1] + ["3"], monkeypatch=monkeypatch, capsys=capsys)[1]
    assert [[h["text"] for h in json.loads(line)["hypotheses"]] for line in other.splitlines()] != texts  # other seed


def test_score_gives_the_log_probability_of_given_translations(workdir, tmp_path, monkeypatch, capsys):
    """score's log P(target | source) is a greedy translation's own score when the text re-encodes to its tokens."""
    lines = [line for line in SOURCES if line]
    translator = Translator.from_workdir(workdir, method="greedy", batch_size=4)
    greedy = [hypotheses[0] for hypotheses in translator.translate_nbest(lines)]
    (tmp_path / "src").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(h.text for h in greedy) + "\n", encoding="utf-8")
    argv = ["score", "--workdir", str(workdir), "--source", str(tmp_path / "src"), "--target", str(tmp_path / "tgt")]
    code, out, _ = run_cli(argv + ["--format", "jsonl"], monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["line"] for row in rows] == [1, 2, 3]
    compared = 0
    for row, hypothesis in zip(rows, greedy):
        assert row["tokens"] == len(translator.tokenizer.encode_target(hypothesis.text)) + 1  # pieces + EOS
        np.testing.assert_allclose(row["log_prob"], sum(row["token_log_probs"]), rtol=1e-5)
        decoded = translator.tokenizer.decode(translator.tokenizer.encode_target(hypothesis.text))
        if decoded == hypothesis.text and "⁇" not in hypothesis.text:
            np.testing.assert_allclose(row["log_prob"], hypothesis.score, rtol=1e-4, atol=1e-4)
            compared += 1
    assert compared, "no greedy translation re-encoded to its own tokens"
    (tmp_path / "short").write_text("one line\n", encoding="utf-8")
    code, _, err = run_cli(argv[:-1] + [str(tmp_path / "short")], monkeypatch=monkeypatch, capsys=capsys)
    assert code != 0 and "has 3 lines but" in err and "Traceback" not in err


def test_a_prefix_file_starts_each_translation(workdir, tmp_path, monkeypatch, capsys):
    (tmp_path / "prefix").write_text("die katze\n\n\nein\n", encoding="utf-8")
    code, out, _ = run_cli(
        ["translate", "--workdir", str(workdir), "--greedy", "--prefix", str(tmp_path / "prefix")],
        stdin="\n".join(SOURCES) + "\n",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    lines = out.split("\n")[:-1]
    assert code == 0 and lines[0].startswith("die katze") and lines[3].startswith("ein") and lines[1] == ""
    code, _, err = run_cli(
        ["translate", "--workdir", str(workdir), "--greedy", "--prefix", str(tmp_path / "missing")],
        stdin="x\n",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code != 0 and "--prefix" in err and "Traceback" not in err


def test_an_ensemble_of_a_run_with_its_copy_translates_as_the_run(workdir, tmp_path, monkeypatch, capsys):
    import shutil

    import sentencepiece as spm

    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    argv = ["translate", "--workdir", str(workdir), "--greedy"]
    alone = run_cli(argv, stdin="\n".join(SOURCES) + "\n", monkeypatch=monkeypatch, capsys=capsys)
    both = run_cli(
        argv + ["--ensemble", str(copy)], stdin="\n".join(SOURCES) + "\n", monkeypatch=monkeypatch, capsys=capsys
    )
    assert alone[0] == both[0] == 0 and both[1] == alone[1]
    model = io.BytesIO()  # another tokenizer in the copy: refused, naming it
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SOURCES * 20), model_writer=model, vocab_size=30, pad_id=0, bos_id=1, eos_id=2, unk_id=3
    )
    (copy / "spm.model").write_bytes(model.getvalue())
    code, _, err = run_cli(argv + ["--ensemble", str(copy)], stdin="x\n", monkeypatch=monkeypatch, capsys=capsys)
    assert code != 0 and "another tokenizer" in err and "Traceback" not in err


def test_shards_and_a_resumed_output_give_the_one_process_translation(workdir, tmp_path, monkeypatch, capsys):
    """--shard K/N: each process its lines; interleaved, the shards are the whole file's translation, sampled draws
    included (a line's draws follow its number). --resume after a kill continues a cut output exactly."""
    lines = [f"{line} {i}" if line else "" for i, line in enumerate(SOURCES * 3)]  # 12 lines
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["translate", "--workdir", str(workdir), "--input", str(source), "--sample", "--seed", "3"]
    common += ["--chunk-lines", "4"]
    code, _, err = run_cli(common + ["--output", str(tmp_path / "whole")], monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "translated 12 lines" in err
    whole = (tmp_path / "whole").read_text(encoding="utf-8").splitlines()
    shards = []
    for k in range(3):
        output = tmp_path / f"shard{k}"
        assert (
            run_cli(common + ["--shard", f"{k}/3", "--output", str(output)], monkeypatch=monkeypatch, capsys=capsys)[0]
            == 0
        )
        shards.append(output.read_text(encoding="utf-8").splitlines())
    assert [len(shard) for shard in shards] == [4, 4, 4]
    assert [shards[i % 3][i // 3] for i in range(12)] == whole
    cut = tmp_path / "cut"  # killed after 5 lines, the 6th half written
    cut.write_text("\n".join(whole[:5]) + "\n" + whole[5][:3], encoding="utf-8")
    code, _, err = run_cli(common + ["--output", str(cut), "--resume"], monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "translated 7 lines after the 5 done before" in err
    assert cut.read_text(encoding="utf-8").splitlines() == whole
    code, _, err = run_cli(common + ["--shard", "3/3"], monkeypatch=monkeypatch, capsys=capsys)
    assert code != 0 and "--shard 3/3" in err and "Traceback" not in err


SPLIT_OVER_DEVICES = """
import json, sys
from transformer_jax import cli
workdir, source, out = sys.argv[1:]
results = {}
methods = {"beam": [], "sample": ["--sample", "--num-samples", "2", "--nbest", "2", "--top-p", "0.9"]}
for name, method in methods.items():
    for devices in ("1", "4"):
        output = f"{out}.{name}.{devices}"
        argv = ["translate", "--workdir", workdir, "--input", source, "--output", output, "--devices", devices]
        assert cli.main(argv + ["--batch-size", "3", "--format", "jsonl"] + method) == 0
        results[f"{name} {devices}"] = [json.loads(line) for line in open(output, encoding="utf-8")]
with open(f"{out}.best", "w", encoding="utf-8") as best:
    best.writelines(row["hypotheses"][0]["text"] + "\\n" for row in results["beam 1"])
for devices in ("1", "4"):
    output = f"{out}.score.{devices}"
    argv = ["score", "--workdir", workdir, "--source", source, "--target", f"{out}.best", "--output", output]
    assert cli.main(argv + ["--batch-size", "3", "--format", "jsonl", "--devices", devices]) == 0
    results[f"score {devices}"] = [json.loads(line) for line in open(output, encoding="utf-8")]
import jax
from transformer_jax import translate
translator = translate.Translator.from_workdir(workdir, devices=jax.local_devices())
results["param_devices"] = len(jax.tree.leaves(translator.params)[0].sharding.device_set)
scorer, scored_on = translate.token_log_probs, []
def recording(model, params, inputs, targets):
    scored_on.append(len(inputs.sharding.device_set))
    return scorer(model, params, inputs, targets)
translate.token_log_probs = recording
translator.score(["a b", "c"], ["d", "e f"])
results["scored_on_devices"] = scored_on
print(json.dumps(results))
"""


def test_a_batch_split_over_four_devices_translates_as_on_one(workdir, tmp_path):
    """--devices 4 on a process with 4 (CPU) devices: each batch of 3 sentences becomes 4 rows, one a device; beam
    and sampling (greedy shares their driver's sharded cache) give the one-device outputs, scores to float rounding,
    and so does scoring references."""
    lines = [f"{line} {i}" if line else "" for i, line in enumerate(SOURCES * 2)]  # 8 lines, 2 blank
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-c", SPLIT_OVER_DEVICES, str(workdir), str(source), str(tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["param_devices"] == 4  # replicated on each
    assert results["scored_on_devices"] == [4]
    one, four = results["score 1"], results["score 4"]  # the beam translations, scored as references
    assert [row["tokens"] for row in one] == [row["tokens"] for row in four] and len(one) == 8
    np.testing.assert_allclose([row["log_prob"] for row in one], [row["log_prob"] for row in four], rtol=1e-5)
    np.testing.assert_allclose(
        [v for row in one for v in row["token_log_probs"]],
        [v for row in four for v in row["token_log_probs"]],
        atol=1e-5,
    )
    for method in ("beam", "sample"):
        one, four = results[f"{method} 1"], results[f"{method} 4"]
        assert len(one) == len(four) == 8
        for a, b in zip(one, four):
            assert [h["text"] for h in a["hypotheses"]] == [h["text"] for h in b["hypotheses"]]
            np.testing.assert_allclose(
                [h["score"] for h in a["hypotheses"]], [h["score"] for h in b["hypotheses"]], rtol=1e-5, atol=1e-5
            )


def test_more_devices_than_the_process_has_is_one_clear_line(workdir, monkeypatch, capsys):
    code, _, err = run_cli(["translate", "--workdir", str(workdir), "--devices", "64"], "a\n", monkeypatch, capsys)
    assert code == 2 and "--devices 64" in err and "Traceback" not in err
