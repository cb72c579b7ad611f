"""Fine-tuning an import-hf workdir: `train --workdir W` starts from the imported parameters with the imported
tokenizer, lowers the training loss, and a stopped run resumes exactly."""

import os
import shutil
import signal

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
pytest.importorskip("safetensors")

import test_hf_marian  # noqa: E402
from conftest import SMALL_CORPUS  # noqa: E402
from flax import traverse_util  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax.experiment import load_experiment  # noqa: E402
from transformer_jax.run_log import read_rows  # noqa: E402
from transformer_jax.train import loop  # noqa: E402
from transformer_jax.workdir import load_params  # noqa: E402

pairs, tokenizer_dir = test_hf_marian.pairs, test_hf_marian.tokenizer_dir
STEPS = 6
SETTINGS = {  # a seconds-long run on the built-in corpus; the model and vocabulary are the imported ones
    "train.steps": STEPS,
    "optimizer.warmup_steps": 4,
    "optimizer.lr_scale": 0.2,  # fine-tuning: smaller steps than training from scratch
    "train.log_every": 1,
    "train.eval_every": 100,
    "train.checkpoint_every": 3,
    "train.progress": False,
    "train.fast_compile": True,
    "train.bleu_every": 0,
    "train.final_bleu": "none",
    "data.tokens_per_batch": 256,
    "data.bucket_boundaries": (64,),
    "data.eval_batch_size": 16,
    "data.max_eval_batches": 2,
    "data.options.split_sizes": SMALL_CORPUS,
}
OVERRIDES = [(key, value if isinstance(value, str) else repr(value)) for key, value in SETTINGS.items()]


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer_dir):
    """A pristine import-hf workdir (copy it before training in it)."""
    model_dir = tmp_path_factory.mktemp("hf-finetune")
    test_hf_marian._save(test_hf_marian._hf_model(tokenizer_dir, "swish-tied"), tokenizer_dir, model_dir)
    workdir = tmp_path_factory.mktemp("imported-finetune") / "run"
    assert cli.main(["import-hf", "--model", str(model_dir), "--workdir", str(workdir)]) == 0
    return workdir


def _copy(imported, directory):
    shutil.copytree(imported, directory)
    return directory


def _losses(workdir):
    return {row["step"]: row["loss"] for row in read_rows(workdir) if row["kind"] == "train"}


def _flat(params):
    return {"/".join(path): np.asarray(leaf) for path, leaf in traverse_util.flatten_dict(params).items()}


@pytest.fixture(scope="module")
def finetuned(imported, tmp_path_factory):
    """`transformer-jax train --workdir W` (no --config: W's config.json) on a copy of the import."""
    workdir = _copy(imported, tmp_path_factory.mktemp("finetuned") / "run")
    argv = [f"--config.{key}={value}" for key, value in OVERRIDES]
    assert cli.main(["train", "--workdir", str(workdir), *argv]) == 0
    return workdir


def test_fine_tuning_starts_from_the_import_keeps_its_tokenizer_and_lowers_the_loss(imported, finetuned):
    assert not (finetuned / "spm.model").exists(), "a new SentencePiece model was trained"
    losses = _losses(finetuned)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    start, tuned = _flat(load_params(imported)), _flat(load_params(finetuned))
    assert start.keys() == tuned.keys()
    start, tuned = (np.concatenate([flat[path].ravel() for path in sorted(flat)]) for flat in (start, tuned))
    correlation = float(np.corrcoef(start, tuned)[0, 1])  # about 0 from a fresh initialisation
    print(
        f"fine-tuning: loss {losses[1]:.4f} -> {losses[STEPS]:.4f}; parameters' correlation with the import "
        f"{correlation:.4f}"
    )
    assert correlation > 0.9


def test_a_stopped_fine_tuning_resumes_with_the_same_losses(imported, finetuned, tmp_path):
    workdir = _copy(imported, tmp_path / "run")
    signal_at = 4  # not a checkpoint interval: the SIGTERM handler saves one

    def send_sigterm(update, metrics):
        if update == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    first = loop.train(load_experiment(workdir / "config.json", OVERRIDES), workdir, on_update=send_sigterm)
    assert first["interrupted"] == "SIGTERM"
    second = loop.train(load_experiment(workdir / "config.json", OVERRIDES), workdir)
    assert second["start_step"] == first["step"] and second["interrupted"] is None
    reference, resumed = _losses(finetuned), _losses(workdir)
    for step in range(1, STEPS + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6, rel=0), step


def test_train_without_config_needs_the_workdirs(tmp_path, capsys):
    assert cli.main(["train", "--workdir", str(tmp_path / "new")]) != 0
    err = capsys.readouterr().err
    assert "has no config.json: give --config" in err and "Traceback" not in err
    assert not (tmp_path / "new").exists()
