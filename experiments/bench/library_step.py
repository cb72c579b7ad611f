"""What the benchmarks time: the library's own train step on a synthetic batch laid out like the data pipeline's.

Imports jax only inside the functions, so a script can set XLA_FLAGS before anything imports it.
"""

from __future__ import annotations


def synthetic_batch(cfg, rows: int, length: int, seed: int = 0) -> dict:
    """Random ids without padding: inputs, targets [rows, length] and decoder_inputs = bos + shifted targets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    targets = rng.integers(3, cfg.vocab_size, (rows, length)).astype(np.int32)  # [rows, length]
    return {
        "inputs": rng.integers(3, cfg.vocab_size, (rows, length)).astype(np.int32),
        "targets": targets,
        "decoder_inputs": np.concatenate([np.full((rows, 1), cfg.bos_id, np.int32), targets[:, :-1]], 1),
    }


class LibraryStep:
    """`make_optimizer` (the experiment defaults: §5.3 Adam and schedule) + `create_train_state` +
    `make_train_step` (label smoothing 0.1) + `jit_train_step` on `mesh`, holding its own state.

    dropout_prng: a `train.dropout_prng` name (default: the experiment default).
    `run(batch)` does one step and waits for it; `step` and `state` are there for lowering and profiling.
    """

    def __init__(self, cfg, mesh, dropout_prng: str | None = None):
        from transformer_jax.experiment import OptimizerConfig, TrainConfig
        from transformer_jax.model import Transformer
        from transformer_jax.train.optimizer import make_optimizer
        from transformer_jax.train.state import create_train_state
        from transformer_jax.train.step import jit_train_step, make_train_step

        train_cfg = TrainConfig()
        tx, schedule = make_optimizer(OptimizerConfig(), cfg.d_model)
        self.state, shardings, _ = create_train_state(cfg, tx, 0, mesh)
        self.step = jit_train_step(
            make_train_step(
                Transformer(cfg),
                tx,
                schedule,
                label_smoothing=train_cfg.label_smoothing,
                dropout_prng=dropout_prng or train_cfg.dropout_prng,
            ),
            shardings,
            mesh,
        )

    def run(self, batch) -> None:
        import jax

        self.state, metrics = self.step(self.state, batch)
        jax.block_until_ready(metrics)
