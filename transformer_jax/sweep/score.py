"""A row scored from its workdir when its run reached the last update without scoring it there (stopped between its
last checkpoint and its validation, or trained with train.final_bleu='none').

The scores are the training run's own, computed from what the workdir holds: the parameters of the last update's
checkpoint and the tokenizer (workdir.load_model_for_inference), placed on the run's mesh as a Trainer places them;
the validation split (data/pipeline.validation_batches for the loss); the eval step alone (train/compiled.py). No
optimizer, train step or workdir lock. The rows are logged as training logs them (train/validation.py's `log_loss`,
`log_bleu` through a ProgressLog: metrics.jsonl and TensorBoard).
"""

from __future__ import annotations

from pathlib import Path

import jax

from transformer_jax import run_log, sharding
from transformer_jax.data.pipeline import validation_batches
from transformer_jax.data.sources import source_from_config
from transformer_jax.experiment import Experiment
from transformer_jax.train.compiled import jitted_eval_step
from transformer_jax.train.progress import ProgressLog
from transformer_jax.train.state import params_shardings
from transformer_jax.train.validation import log_bleu, log_loss, validation_bleu, validation_loss
from transformer_jax.workdir import kept_steps, load_model_for_inference


def score_at_end(experiment: Experiment, workdir: Path) -> None:
    """Logs in `workdir` what its run log lacks at the last update (train.steps): the validation loss ('eval') and
    the BLEU of the whole validation split ('final_bleu', decoded by train.final_bleu, beam if that is 'none'), of
    the checkpoint of that update; nothing without that checkpoint. Runs after `train` in the same process (JAX's
    processes already joined)."""
    steps = experiment.train.steps
    logged = {row["kind"] for row in run_log.read_rows(workdir) if row["step"] == steps}
    missing = {"eval", "final_bleu"} - logged
    if not missing or steps not in kept_steps(workdir):
        return
    layout = sharding.make_layout(experiment.mesh.shape, experiment.mesh.rules, experiment.model)
    model_cfg, params, tokenizer = load_model_for_inference(workdir, steps)
    shardings = params_shardings(model_cfg, layout.mesh, layout.rules)
    params = jax.device_put(params, shardings)
    pairs = list(source_from_config(experiment.data, splits=("validation",)).pairs("validation"))
    log = ProgressLog(workdir, steps, steps, progress=False, write=jax.process_index() == 0)
    try:
        if "eval" in missing:
            eval_step = jitted_eval_step(model_cfg, experiment.train, shardings, layout.mesh, layout.rules)
            batches = validation_batches(tokenizer, pairs, experiment.data)
            log_loss(log, steps, validation_loss(eval_step, params, batches, layout.mesh, layout.rules, layout.shard))
        if "final_bleu" in missing:
            method = experiment.train.final_bleu if experiment.train.final_bleu != "none" else "beam"
            scores = validation_bleu(model_cfg, params, tokenizer, pairs, experiment.decode, method)
            if scores is not None:
                log_bleu(log, "final_bleu", steps, method, scores)
    finally:
        log.close()
