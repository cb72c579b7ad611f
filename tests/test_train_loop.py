"""The runner through its real pieces: builtin corpus, SentencePiece, orbax checkpoints, TensorBoard, PNG, BLEU.

Most runs here share one small model, so the jitted functions compile once per process.
"""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_CORPUS, tiny_run_overrides

from transformer_jax import cli
from transformer_jax.checkpoint import CheckpointDamagedError, Checkpointer, CheckpointMismatchError
from transformer_jax.experiment import ConfigError, load_experiment
from transformer_jax.run_log import read_rows
from transformer_jax.train import loop
from transformer_jax.workdir import load_model_for_inference

STEPS = 6
NO_BLEU = {"train.bleu_every": 0, "train.final_bleu": "none"}  # decoding is tested on its own below


def overrides(steps=STEPS, **changes):
    return tiny_run_overrides(steps, **{**NO_BLEU, **changes})


def small_config(steps=STEPS, **changes):
    return load_experiment("experiments/tiny.py", overrides(steps, **changes))


def train_losses(workdir):
    return {row["step"]: row["loss"] for row in read_rows(workdir) if row["kind"] == "train"}


def snapshot(directory: Path) -> dict:
    return {
        str(path.relative_to(directory)): (path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    summary = loop.train(small_config(), workdir)
    return workdir, summary


@pytest.mark.rounding
def test_uninterrupted_run_learns_and_writes_everything(uninterrupted):
    workdir, summary = uninterrupted
    losses = train_losses(workdir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    assert summary["step"] == STEPS and summary["time_to_first_step"] > 0
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [3, 6]
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["vocab_size"] == 200 and saved["model"]["d_model"] == 32
    (ran_on,) = [row for row in read_rows(workdir) if row["kind"] == "machine"]  # what the figures came from
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    assert ran_on["step"] == 0 and ran_on["cpu"] and (not names or ran_on["cpu"].startswith(names[0]))
    assert ran_on["devices"].endswith(" x cpu") and ran_on["cpu_cores"] >= 1


def test_stopped_by_sigterm_and_resumed_gives_the_same_losses(uninterrupted, tmp_path):
    reference = train_losses(uninterrupted[0])
    signal_at = 4  # neither it nor the next update is a checkpoint interval: the SIGTERM handler must save one

    def send_sigterm(update, metrics):
        if update == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    first = loop.train(small_config(), tmp_path, on_update=send_sigterm)
    # on_update runs once an update has finished; the loop has dispatched at most one more (MAX_IN_FLIGHT = 2).
    assert first["interrupted"] == "SIGTERM" and signal_at <= first["step"] <= signal_at + loop.MAX_IN_FLIGHT - 1
    stop_at = first["step"]
    assert (tmp_path / "checkpoints" / str(stop_at)).is_dir()
    second = loop.train(small_config(), tmp_path)
    assert second["start_step"] == stop_at and second["interrupted"] is None
    resumed = train_losses(tmp_path)
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6, rel=0), step
    assert second["eval"]["loss"] == pytest.approx(uninterrupted[1]["eval"]["loss"], abs=1e-6)


def test_a_run_with_sampled_segmentations_resumes_with_the_same_losses(uninterrupted, tmp_path):
    """data.tokenizer_sampling: the batches differ from the one-best segmentation's (different losses), and a run
    stopped by SIGTERM resumes on the same sampled segmentations (the same losses as without the stop)."""
    sampling = {"data.tokenizer_sampling": 0.1}
    whole = loop.train(small_config(**sampling), tmp_path / "whole")
    losses = train_losses(tmp_path / "whole")
    assert losses[1] != pytest.approx(train_losses(uninterrupted[0])[1], abs=1e-4)

    def send_sigterm(update, metrics):
        if update == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert loop.train(small_config(**sampling), tmp_path / "stopped", on_update=send_sigterm)["interrupted"]
    loop.train(small_config(**sampling), tmp_path / "stopped")
    resumed = train_losses(tmp_path / "stopped")
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(losses[step], abs=1e-6, rel=0), step
    assert whole["step"] == STEPS


def test_a_run_from_prepared_data_resumes_with_the_in_memory_runs_losses(uninterrupted, tmp_path):
    """data.prepared (the training split encoded once by `prepare`): the same batches as encoding at start-up, so the
    same losses, through a SIGTERM stop and a resume from the checkpoint's data position."""
    from transformer_jax.data.prepared import prepare

    config = small_config()
    prepare(config.data, tmp_path / "prepared", seed=config.train.seed, part=(0, 1), workers=1, chunk_pairs=500)
    prepared = {"data.prepared": str(tmp_path / "prepared")}

    def send_sigterm(update, metrics):
        if update == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert loop.train(small_config(**prepared), tmp_path / "run", on_update=send_sigterm)["interrupted"]
    assert loop.train(small_config(**prepared), tmp_path / "run")["start_step"] >= 2
    resumed, reference = train_losses(tmp_path / "run"), train_losses(uninterrupted[0])
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6, rel=0), step


def test_checkpoint_of_another_shape_is_refused_and_nothing_is_overwritten(uninterrupted):
    workdir = uninterrupted[0]
    before = snapshot(workdir)
    with pytest.raises(ConfigError) as error:
        loop.train(small_config(**{"model.d_ff": 48}), workdir)
    message = str(error.value)
    assert "model.d_ff: 64 → 48" in message  # the config field, not a list of tensors
    assert "model.d_model" not in message  # only what differs
    assert snapshot(workdir) == before
    # Without config.json (an older workdir), the checkpoint's tensors are compared and named instead.
    config_json = (workdir / "config.json").read_bytes()
    (workdir / "config.json").unlink()
    try:
        with pytest.raises(CheckpointMismatchError, match=r"\(32, 64\) vs config \(32, 48\)"):
            loop.train(small_config(**{"model.d_ff": 48}), workdir)
    finally:
        (workdir / "config.json").write_bytes(config_json)


@pytest.mark.parametrize(
    "change, field", [({"data.tokens_per_batch": 512}, "data.tokens_per_batch"), ({"train.seed": 5}, "train.seed")]
)
def test_resume_refuses_a_different_data_stream(uninterrupted, change, field):
    workdir = uninterrupted[0]
    before = snapshot(workdir)
    with pytest.raises(ConfigError, match=field):
        loop.train(small_config(**change), workdir)
    assert snapshot(workdir) == before  # config.json untouched


def test_resume_allows_more_steps_with_a_notice(uninterrupted, tmp_path, caplog):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(uninterrupted[0], workdir)
    summary = loop.train(small_config(STEPS + 1), workdir)
    assert summary["start_step"] == STEPS and summary["step"] == STEPS + 1
    assert "train.steps: 6 → 7" in caplog.text
    assert json.loads((workdir / "config.json").read_text())["train"]["steps"] == STEPS + 1


def test_replaying_a_saved_config_json_resumes_the_run(uninterrupted, tmp_path):
    import shutil

    workdir = tmp_path / "replay"
    shutil.copytree(uninterrupted[0], workdir)
    config = load_experiment(str(workdir / "config.json"), [("train.steps", str(STEPS + 1))])
    summary = loop.train(config, workdir)
    assert summary["start_step"] == STEPS and summary["step"] == STEPS + 1


@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143), (None, 0)])
def test_train_exit_code_says_a_signal_stopped_it(monkeypatch, tmp_path, capsys, name, code):
    """`transformer-jax train` on a tiny run that receives the signal after update 2 stops early and exits with 128 +
    the signal's number, as shells report a process a signal stopped (a script running it stops too); unsignalled,
    it runs to the end and exits 0."""
    train = loop.train

    def send_signal(update, metrics):
        if name and update == 2:
            os.kill(os.getpid(), getattr(signal, name))

    monkeypatch.setattr(loop, "train", lambda config, workdir: train(config, workdir, on_update=send_signal))
    command = ["train", "--config", "experiments/tiny.py", "--workdir", str(tmp_path / "w")]
    assert cli.main(command + [f"--config.{key}={value}" for key, value in overrides()]) == code
    last = capsys.readouterr().out.splitlines()[-1]
    if name:
        assert f"stopped by {name}, rerun the same command to resume" in last and f"update {STEPS}," not in last
    else:
        assert last.startswith(f"done: update {STEPS},") and "stopped" not in last


def test_time_budget_stops_saves_and_evaluates(tmp_path):
    """18 s, far from 10k updates. Under train.keep_best the last checkpoint is validated before it is saved, so it
    is ranked with the others (orbax holds its perplexity) and validated once."""
    config = small_config(10_000, **{"train.max_minutes": 0.3, "train.keep_best": 2, "train.eval_every": 3})
    summary = loop.train(config, tmp_path)
    step = summary["stopped_by"].startswith("time budget") and summary["step"]
    assert 0 < step < 10_000 and (tmp_path / "checkpoints" / str(step)).is_dir()
    assert summary["updates_per_minute"] == pytest.approx(step / 0.3)  # the rate a recipe's budget buys here
    assert summary["eval"] is not None
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (last_eval,) = [row for row in lines if row["kind"] == "eval" and row["step"] == step]
    checkpointer = Checkpointer(tmp_path, keep=None)
    assert checkpointer.manager.metrics(step) == {"perplexity": last_eval["perplexity"]}
    checkpointer.close()


def test_load_model_for_inference(uninterrupted):
    import flax.linen as nn
    import jax

    from transformer_jax.model import Transformer

    workdir, summary = uninterrupted
    model_cfg, params, tokenizer = load_model_for_inference(workdir)
    assert model_cfg.vocab_size == tokenizer.vocab_size == 200 and model_cfg.d_ff == 64
    assert tokenizer.decode(tokenizer.encode("two small dogs") + [tokenizer.eos_id, 5]) == "two small dogs"
    ids = np.ones((1, 4), np.int32)
    expected = nn.unbox(jax.eval_shape(Transformer(model_cfg).init, jax.random.PRNGKey(0), ids, ids))["params"]
    flat = lambda tree: {
        jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    assert flat(params) == flat(expected)


def test_cli_end_to_end(tmp_path, capsys):
    argv = ["train", "--config", "experiments/tiny.py", "--workdir", str(tmp_path)]
    argv += [f"--config.{key}={value}" for key, value in overrides(steps=3)]
    assert cli.main(argv) == 0
    assert "done: update 3" in capsys.readouterr().out
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "curves.png").is_file()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--config.train.stepz=3"], "unknown field 'stepz'"),
        (["--config.train.steps=many"], "expected an int"),
        (["--config.model.vocab_size=9"], "come from the SentencePiece model"),
        (["--config.model.num_heads=3"], "not divisible by num_heads=3"),
        (["--config.data.source=multi30k"], "--config.data.path"),
        (["--config.data.source=multi30k", "--config.data.path=/nonexistent"], "not a directory"),
        (["--config.train.final_bleu=sampled"], "train.final_bleu='sampled' is unknown"),
        (["--config.mesh.mode=spmd"], "mesh.mode='spmd' is unknown"),
        (["--config.mesh.rules=zero3"], "mesh.rules='zero3' is unknown"),
        (["--config.decode.beam_size=0"], "decode.beam_size=0 must be a positive integer"),
        (["--config.data.tokenizer_sampling=1"], "data.tokenizer_sampling=1.0 must lie in [0, 1)"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path, capsys, argv, expected):
    workdir = tmp_path / "run"
    code = cli.main(["train", "--config", "experiments/tiny.py", "--workdir", str(workdir), *argv])
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not workdir.exists()


def test_pmap_mode_gives_the_losses_of_jit_mode(tmp_path):
    # Dropout off: the per-device step draws its own masks on each device; everything else is the same arithmetic.
    changes = {"model.dropout_rate": 0.0}
    jit_summary = loop.train(small_config(3, **changes), tmp_path / "jit")
    pmap_summary = loop.train(small_config(3, **changes, **{"mesh.mode": "pmap"}), tmp_path / "pmap")
    jit_losses, pmap_losses = train_losses(tmp_path / "jit"), train_losses(tmp_path / "pmap")
    assert sorted(pmap_losses) == [1, 2, 3]
    for step, loss in jit_losses.items():
        assert pmap_losses[step] == pytest.approx(loss, rel=1e-5), step
    assert pmap_summary["eval"]["loss"] == pytest.approx(jit_summary["eval"]["loss"], rel=1e-5)
    assert (tmp_path / "pmap" / "checkpoints" / "3").is_dir()


def test_validation_bleu_is_logged_and_equals_a_recomputation_with_the_saved_params(tmp_path):
    from transformer_jax.data.sources import source_from_config
    from transformer_jax.evaluation import evaluate_pairs
    from transformer_jax.translate import Translator

    config = small_config(3, **{"train.bleu_every": 3, "train.bleu_max_sentences": 8, "train.final_bleu": "greedy"})
    summary = loop.train(config, tmp_path)
    rows = {row["kind"]: row for row in read_rows(tmp_path) if row["kind"] in ("bleu", "final_bleu")}
    assert rows["bleu"]["step"] == rows["final_bleu"]["step"] == 3
    assert rows["bleu"]["sentences"] == 8 and rows["final_bleu"]["sentences"] == SMALL_CORPUS["validation"]
    pairs = list(source_from_config(config.data).pairs("validation"))
    model_cfg, params, tokenizer = load_model_for_inference(tmp_path)  # the checkpoint of update 3
    translator = Translator(model_cfg, params, tokenizer, decode_config=config.decode, method="greedy")
    for kind, subset in (("bleu", pairs[:8]), ("final_bleu", pairs)):
        scores = evaluate_pairs(translator, subset).scores
        row = rows[kind]
        assert 0.0 <= row["bleu"] <= 100.0 and 0.0 < row["chrf"] <= 100.0, row
        assert (row["bleu"], row["chrf"], row["bleu_lowercase"]) == pytest.approx(
            (scores.bleu, scores.chrf, scores.bleu_lowercase), abs=1e-9
        ), kind
    assert summary["final_bleu"]["chrf"] == rows["final_bleu"]["chrf"]


@pytest.mark.parametrize("empty_split", ["train", "val"])
def test_empty_split_files_fail_before_any_work(tmp_path, capsys, empty_split):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        for lang in ("en", "de"):
            (data / f"{split}.{lang}").write_text("" if split == empty_split else "a cat\nein Hund\n")
    workdir = tmp_path / "run"
    code = cli.main(
        ["train", "--config", "experiments/multi30k.py", "--workdir", str(workdir), f"--config.data.path={data}"]
    )
    err = capsys.readouterr().err
    split_name = "train" if empty_split == "train" else "validation"
    assert code == 2 and f"the {split_name} split" in err and "no sentence pairs" in err
    assert not workdir.exists()


def test_a_misspelt_source_option_is_a_config_error(tmp_path, capsys):
    code = cli.main(
        [
            "train",
            "--config",
            "experiments/tiny.py",
            "--workdir",
            str(tmp_path / "run"),
            "--config.data.options.split_sizez={'train': 10}",
        ]
    )
    assert code == 2 and "data.options" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "empty_metadata", "missing_state"])
def test_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(uninterrupted, tmp_path, damage, caplog):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(uninterrupted[0], workdir)
    latest = workdir / "checkpoints" / str(STEPS)
    if damage == "truncate":
        for path in (latest / "state").rglob("*"):
            if path.is_file() and path.stat().st_size > 1000:
                path.write_bytes(path.read_bytes()[:100])
    elif damage == "empty_metadata":
        (latest / "state" / "_METADATA").write_bytes(b"")
    else:
        shutil.rmtree(latest / "state")
    with pytest.raises(CheckpointDamagedError) as error:  # inference names the damaged step and the others
        load_model_for_inference(workdir)
    assert f"checkpoint {STEPS}" in str(error.value) and "[3]" in str(error.value)
    summary = loop.train(small_config(), workdir)
    assert summary["start_step"] == 3 and summary["step"] == STEPS  # redone from the intact update 3
    assert "damaged" in caplog.text
    assert (workdir / "checkpoints" / f"damaged_{STEPS}").is_dir()  # set aside, not deleted
    np.testing.assert_allclose(train_losses(workdir)[STEPS], train_losses(uninterrupted[0])[STEPS], atol=1e-6)


def test_skipped_pairs_are_summarised_in_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    pairs = [
        pair
        for i in range(20)
        for pair in ((f"cat number {i}", f"Katze Nummer {i}"), ("", "leer"), (f"dog {i}", f"Hund {i}"))
    ]
    for split in ("train", "val"):
        (data / f"{split}.en").write_text("".join(f"{en}\n" for en, _ in pairs))
        (data / f"{split}.de").write_text("".join(f"{de}\n" for _, de in pairs))
    overrides = [(key, value) for key, value in tiny_run_overrides(1, **NO_BLEU) if "split_sizes" not in key]
    config = load_experiment(
        "experiments/multi30k.py", [*overrides, ("data.path", str(data)), ("data.vocab_size", "40")]
    )
    loop.train(config, tmp_path / "run")
    out = capsys.readouterr().out
    assert "skipped pairs: train 20 empty, 0 too long (kept 40); validation 20 empty" in out


def test_ctrl_c_during_set_up_exits_130_without_a_traceback(monkeypatch, tmp_path, capsys):
    def interrupted(config, workdir):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", interrupted)
    code = cli.main(["train", "--config", "experiments/tiny.py", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted before training started" in err and "Traceback" not in err
