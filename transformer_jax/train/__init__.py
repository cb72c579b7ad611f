"""Training (paper §5): label-smoothed loss, Adam + warm-up schedule, TrainState, jitted steps, the training loop."""

from transformer_jax.train.loss import LossSums, cross_entropy_sums, smoothed_targets, summarize
from transformer_jax.train.optimizer import make_optimizer, transformer_schedule
from transformer_jax.train.state import TrainState, create_train_state, state_initializer
from transformer_jax.train.step import make_eval_step, make_train_step

__all__ = [
    "LossSums",
    "cross_entropy_sums",
    "smoothed_targets",
    "summarize",
    "make_optimizer",
    "transformer_schedule",
    "TrainState",
    "create_train_state",
    "state_initializer",
    "make_eval_step",
    "make_train_step",
]
