"""The runner through its real pieces: builtin corpus, SentencePiece, orbax checkpoints, TensorBoard, PNG.

All runs here share one small model, so the jitted functions compile once per process.
"""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from transformer_jax import cli
from transformer_jax.checkpoint import CheckpointMismatchError, load_model_for_inference
from transformer_jax.train import loop

STEPS = 6
SMALL_CORPUS = {"train": 1500, "validation": 40, "test": 10}
MODEL_OVERRIDES = dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1, max_len=32)


def overrides(steps=STEPS, **changes):
    """--config.* overrides of experiments/tiny.py that make a run take seconds."""
    values = {"train.steps": steps, "train.warmup_steps": 4, "train.log_every": 1, "train.eval_every": 3,
              "train.checkpoint_every": 3, "train.progress": False, "train.fast_compile": True, "data.vocab_size": 200, "data.max_len": 32,
              "data.tokens_per_batch": 256, "data.bucket_boundaries": (32,), "data.eval_batch_size": 16,
              "data.max_eval_batches": 2, "data.options.split_sizes": SMALL_CORPUS,
              **{f"model.{key}": value for key, value in MODEL_OVERRIDES.items()}, **changes}
    return [(key, repr(value) if not isinstance(value, str) else value) for key, value in values.items()]


def small_config(steps=STEPS, **changes):
    return cli.load_experiment("experiments/tiny.py", overrides(steps, **changes))


def train_losses(workdir):
    return {row["step"]: row["loss"] for row in loop.read_metrics(workdir) if row["kind"] == "train"}


def snapshot(directory: Path) -> dict:
    return {str(path.relative_to(directory)): (path.stat().st_mtime_ns, path.read_bytes())
            for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    summary = loop.train(small_config(), workdir)
    return workdir, summary


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


def test_stopped_by_sigterm_and_resumed_gives_the_same_losses(uninterrupted, tmp_path):
    reference = train_losses(uninterrupted[0])
    stop_at = 2  # not a checkpoint interval: the SIGTERM handler must save one

    def send_sigterm(update, metrics):
        if update == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    first = loop.train(small_config(), tmp_path, on_update=send_sigterm)
    assert first["interrupted"] == "SIGTERM" and first["step"] == stop_at
    assert (tmp_path / "checkpoints" / str(stop_at)).is_dir()
    second = loop.train(small_config(), tmp_path)
    assert second["start_step"] == stop_at and second["interrupted"] is None
    resumed = train_losses(tmp_path)
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6, rel=0), step
    assert second["eval"]["loss"] == pytest.approx(uninterrupted[1]["eval"]["loss"], abs=1e-6)


def test_checkpoint_of_another_shape_is_refused_and_nothing_is_overwritten(uninterrupted):
    workdir = uninterrupted[0]
    before = snapshot(workdir)
    with pytest.raises(CheckpointMismatchError) as error:
        loop.train(small_config(**{"model.d_ff": 48}), workdir)
    message = str(error.value)
    assert "encoder/layer_0/ffn/" in message and "decoder/layer_0/ffn/" in message
    assert "(32, 64) vs config (32, 48)" in message
    assert "self_attention" not in message  # only the differing parameters are named
    assert snapshot(workdir) == before


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
    flat = lambda tree: {jax.tree_util.keystr(path): leaf.shape for path, leaf in
                         jax.tree_util.tree_flatten_with_path(tree)[0]}
    assert flat(params) == flat(expected)


def test_cli_end_to_end(tmp_path, capsys):
    argv = ["train", "--config", "experiments/tiny.py", "--workdir", str(tmp_path)]
    argv += [f"--config.{key}={value}" for key, value in overrides(steps=3)]
    assert cli.main(argv) == 0
    assert "done: update 3" in capsys.readouterr().out
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "curves.png").is_file()


@pytest.mark.parametrize("argv, expected", [
    (["--config.train.stepz=3"], "unknown field 'stepz'"),
    (["--config.train.steps=many"], "expected a int"),
    (["--config.model.vocab_size=9"], "come from the SentencePiece model"),
    (["--config.model.num_heads=3"], "not divisible by num_heads=3"),
    (["--config.data.source=multi30k"], "--config.data.path"),
    (["--config.data.source=multi30k", "--config.data.path=/nonexistent"], "not a directory"),
])
def test_bad_config_fails_before_any_work(tmp_path, capsys, argv, expected):
    workdir = tmp_path / "run"
    code = cli.main(["train", "--config", "experiments/tiny.py", "--workdir", str(workdir), *argv])
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not workdir.exists()
