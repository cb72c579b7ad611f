"""Transformer big on WMT 2014 EN→DE (paper §5, Table 3 'big'): 300k updates, P_drop 0.3.

    transformer-jax train --config experiments/big.py --workdir runs/big --config.data.path=$TFDS_DATA_DIR
"""

from transformer_jax.experiment import default_config, model_section


def get_config():
    config = default_config()
    config.model = model_section("big")  # N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3
    config.data.source = "tfds"
    config.data.vocab_size = 37000
    config.data.tokens_per_batch = 25000
    config.data.max_len = 256
    config.train.steps = 300_000  # §5.2: 3.5 days on 8 P100
    config.train.warmup_steps = 4000
    config.train.label_smoothing = 0.1
    config.train.log_every = 100
    config.train.eval_every = 5000
    config.train.checkpoint_every = 600  # §6.1: every 10 minutes; 300k updates took 3.5 days (~600 a 10 min)
    config.train.keep_checkpoints = 20  # §6.1: big averages the last 20 checkpoints
    return config
