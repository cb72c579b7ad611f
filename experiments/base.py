"""Transformer base on WMT 2014 EN→DE (paper §5, Table 3 'base'): 100k updates of ~25k+25k tokens.

    transformer-jax train --config experiments/base.py --workdir runs/base --config.data.path=$TFDS_DATA_DIR

The paper trained on 8 P100 GPUs (12 hours). On fewer devices keep the global batch with
--config.train.accum_steps=K --config.data.tokens_per_batch=$((35000 / K)).
"""

from transformer_jax.config import base
from transformer_jax.experiment import DataConfig, Experiment, OptimizerConfig, TrainConfig


def get_config() -> Experiment:
    return Experiment(
        model=base(),  # N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1
        data=DataConfig(
            source="tfds",  # wmt14_translate/de-en (prepared as ArrayRecord under data.path)
            vocab_size=37000,  # §5.1 shared BPE vocabulary of about 37000 tokens
            # §5.1: batches of about 25000 source and 25000 target tokens. tokens_per_batch counts padded positions
            # per side (rows x bucket length); with the default buckets about 72% of them are real tokens on
            # WMT-like lengths (tests/test_batching.py), so 35000 positions hold about 25000 real tokens a side.
            tokens_per_batch=35000,
            max_len=256,
        ),
        optimizer=OptimizerConfig(warmup_steps=4000),  # §5.3
        train=TrainConfig(
            steps=100_000,  # §5.2
            label_smoothing=0.1,  # §5.4
            log_every=100,
            eval_every=5000,
            checkpoint_every=1400,  # §6.1: every 10 minutes; 100k updates took 12 h (~1400 a 10 min)
            keep_checkpoints=5,  # §6.1: base averages the last 5 checkpoints
        ),
    )
