"""Multi30k task 1, EN→DE (29k caption pairs): a small Transformer for a laptop / 2-core CPU (about an hour idle).

    transformer-jax train --config experiments/multi30k.py --workdir runs/multi30k \\
        --config.data.path=../shared/data/multi30k

d_model 256, 4 heads, d_ff 1024, 3+3 layers, an 8k shared BPE vocabulary; stronger dropout for the small
data set (the paper's 0.1 overfits Multi30k).
"""

from transformer_jax.train.loop import default_config, model_section


def get_config():
    config = default_config()
    config.model = model_section("base", d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3,
                                 num_decoder_layers=3, dropout_rate=0.3, max_len=128)
    config.data.source = "multi30k"
    config.data.path = ""  # required: --config.data.path=/path/to/multi30k (train.en, train.de, val.*, ...)
    config.data.source_lang = "en"
    config.data.target_lang = "de"
    config.data.vocab_size = 8000
    # Packing: one training shape (32 rows x 128), so XLA compiles once instead of once per length bucket
    # (each compile is tens of seconds on a small CPU). Validation uses two buckets.
    config.data.tokens_per_batch = 4096
    config.data.max_len = 128
    config.data.pack = True
    config.data.bucket_boundaries = (64, 128)
    config.data.eval_batch_size = 128
    # ~100 updates an epoch; 2000 updates = ~20 epochs. Not yet run to the end: on the shared 2-core machine
    # an update took ~6 s under heavy load (~1,200 tokens/s); expect ~2 s idle, i.e. about an hour.
    config.train.steps = 2000
    config.train.warmup_steps = 800
    config.train.lr_scale = 1.0
    config.train.log_every = 50
    config.train.eval_every = 500
    config.train.checkpoint_every = 500
    config.train.keep_checkpoints = 5
    return config
