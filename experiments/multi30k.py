"""Multi30k task 1, EN→DE (29k caption pairs): a small Transformer for a laptop / 2-core CPU (about an hour idle).

    transformer-jax train --config experiments/multi30k.py --workdir runs/multi30k \\
        --config.data.path=../shared/data/multi30k

The size of the published small-Transformer reference on this data (fairseq, 4 layers, d_model 128): 4 heads,
d_ff 512, 4+4 layers, an 8k shared BPE vocabulary, dropout 0.2 (the paper's 0.1 overfits 29k pairs).
On a 2-core CPU an update (about 4k target tokens) takes about 0.8 s.
"""

from transformer_jax.train.loop import default_config, model_section


def get_config():
    config = default_config()
    config.model = model_section("base", d_model=128, num_heads=4, d_ff=512, num_encoder_layers=4,
                                 num_decoder_layers=4, dropout_rate=0.2, max_len=128)
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
    # ~100 updates an epoch; 6000 updates = ~60 epochs.
    config.train.steps = 6000
    config.train.warmup_steps = 1000
    config.train.lr_scale = 0.5  # peak lr 128^-0.5 * 1000^-0.5 * 0.5 = 1.4e-3
    config.train.log_every = 50
    config.train.eval_every = 1000
    config.train.checkpoint_every = 250
    config.train.keep_checkpoints = 10  # the last 10 are averaged, as in the reference
    return config
