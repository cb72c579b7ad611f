"""Multi30k task 1, EN→DE (29k caption pairs): a small Transformer for a laptop or a small CPU machine.

    transformer-jax train --config experiments/multi30k.py --workdir runs/multi30k \\
        --config.data.path=../shared/data/multi30k

d_model 256, 4 heads, d_ff 1024, 3+3 layers, an 8k shared BPE vocabulary, dropout 0.3 (the paper's 0.1
overfits 29k pairs). On 2 idle CPU cores an update (about 4k source + 4k target tokens) takes about 3.7 s.
"""

from transformer_jax.experiment import default_config, model_section


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
    # ~100 updates an epoch; 2400 updates = ~24 epochs, about 2.5 hours on 2 CPU cores.
    config.train.steps = 2400
    config.train.warmup_steps = 800
    config.train.lr_scale = 0.7  # peak lr 256^-0.5 * 800^-0.5 * 0.7 = 1.5e-3
    config.train.log_every = 50
    config.train.eval_every = 400
    config.train.checkpoint_every = 100
    config.train.bleu_every = 800  # greedy BLEU of 500 validation pairs, with every other eval
    config.train.final_bleu = "beam"  # the whole validation split (1014 pairs), beam 4, alpha 0.6 (§6.1)
    config.train.keep_checkpoints = 10  # averaging uses the last 5 (paper §6.1 for base)
    return config
