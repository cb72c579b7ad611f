"""Shared test settings: a tiny run of experiments/tiny.py that takes seconds on a 2-core CPU."""

import os
from pathlib import Path

# Subprocesses (the CLI, multi-host workers, helpers, notebook kernels) fail on a deprecated jax / flax / optax /
# orbax API too: they import helpers/strict_warnings/sitecustomize.py at start-up.
_STRICT = str(Path(__file__).resolve().parent / "helpers" / "strict_warnings")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_STRICT, os.environ.get("PYTHONPATH")]))

SMALL_CORPUS = {"train": 1500, "validation": 40, "test": 10}
SMALL_MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1, max_len=32)


def tiny_run_overrides(steps: int = 6, **changes) -> list[tuple[str, str]]:
    """--config.* overrides of experiments/tiny.py for a seconds-long run on a small slice of the corpus."""
    values = {
        "train.steps": steps,
        "optimizer.warmup_steps": 4,
        "train.log_every": 1,
        "train.eval_every": 3,
        "train.checkpoint_every": 3,
        "train.progress": False,
        "train.fast_compile": True,
        "train.final_bleu": "none",
        "data.vocab_size": 200,
        "data.max_len": 32,
        "data.tokens_per_batch": 256,
        "data.bucket_boundaries": (32,),
        "data.eval_batch_size": 16,
        "data.max_eval_batches": 2,
        "data.options.split_sizes": SMALL_CORPUS,
        **{f"model.{key}": value for key, value in SMALL_MODEL.items()},
        **changes,
    }
    return [(key, value if isinstance(value, str) else repr(value)) for key, value in values.items()]
