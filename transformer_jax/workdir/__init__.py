"""A run's working directory, owned here: its layout, the check before a command writes into it, config.json and the
resume policy (run.py), the trainer's lock (lock.py), a trained run's parameters and their averages (params.py).

    {workdir}/config.json          resolved experiment config (model section complete: vocab and special ids)
    {workdir}/spm.model            the SentencePiece model (data/tokenizer.py)
    {workdir}/source.spm, target.spm, vocab.json    instead of spm.model, an imported Marian model's tokenizer
                                   (data/marian_tokenizer.py, `transformer-jax import-hf`)
    {workdir}/checkpoints/{step}/  state/ (TrainState: params, opt_state, step, rng, ...), data/ (iterator JSON)
    {workdir}/averaged/            params averaged over checkpoints: the last N or the best N by validation
                                   (`transformer-jax average`)
    {workdir}/imported/            params loaded from a torch state_dict or a Hugging Face Marian model
                                   (`transformer-jax import-torch`, `import-hf`)
    {workdir}/metrics.jsonl        the run log: a JSON row per train / validation figure (run_log.py)
    {workdir}/tensorboard/, curves.png    the same figures drawn (train/progress.py)
    {workdir}/train.lock           held by the trainer while it runs (`TrainerLock`)

The checkpoints themselves are checkpoint.py's (orbax).
"""

from transformer_jax.workdir.lock import LOCK_FILENAME, TrainerLock, WorkdirBusyError
from transformer_jax.workdir.params import (
    BEST,
    LATEST,
    NAMED_PARAMS,
    average_best,
    average_last,
    average_params,
    best_checkpoints,
    kept_steps,
    load_model_for_inference,
    load_params,
    restore_named_params,
    run_best_metric,
    save_named_params,
)
from transformer_jax.workdir.run import (
    CONFIG_FILENAME,
    check_resumable,
    check_workdir,
    load_config,
    model_config_from_workdir,
    open_for_training,
    resume_changes,
    save_config,
    save_json,
)

__all__ = [
    "BEST",
    "CONFIG_FILENAME",
    "LATEST",
    "LOCK_FILENAME",
    "NAMED_PARAMS",
    "TrainerLock",
    "WorkdirBusyError",
    "average_best",
    "average_last",
    "average_params",
    "best_checkpoints",
    "check_resumable",
    "check_workdir",
    "kept_steps",
    "load_config",
    "load_model_for_inference",
    "load_params",
    "model_config_from_workdir",
    "open_for_training",
    "restore_named_params",
    "resume_changes",
    "run_best_metric",
    "save_config",
    "save_json",
    "save_named_params",
]
