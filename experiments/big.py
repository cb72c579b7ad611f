"""Transformer big on WMT 2014 EN→DE (paper §5, Table 3 'big'): 300k updates, P_drop 0.3.

transformer-jax train --config experiments/big.py --workdir runs/big --config.data.path=$TFDS_DATA_DIR
"""

from transformer_jax.config import big
from transformer_jax.experiment import DataConfig, Experiment, OptimizerConfig, TrainConfig


def get_config() -> Experiment:
    return Experiment(
        model=big(),  # N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3
        data=DataConfig(source="tfds", vocab_size=37000, tokens_per_batch=25000, max_len=256),
        optimizer=OptimizerConfig(warmup_steps=4000),  # §5.3
        train=TrainConfig(
            steps=300_000,  # §5.2: 3.5 days on 8 P100
            label_smoothing=0.1,  # §5.4
            log_every=100,
            eval_every=5000,
            checkpoint_every=600,  # §6.1: every 10 minutes; 300k updates took 3.5 days (~600 a 10 min)
            keep_checkpoints=20,  # §6.1: big averages the last 20 checkpoints
        ),
    )
