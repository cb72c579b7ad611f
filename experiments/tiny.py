"""Tiny: the built-in EN→DE corpus, a small model that trains in a few minutes on a 2-core CPU (`make demo`).

    transformer-jax train --config experiments/tiny.py --workdir runs/tiny
"""

from transformer_jax.experiment import default_config, model_section


def get_config():
    config = default_config()
    config.model = model_section("tiny", d_model=128, num_heads=4, d_ff=512, num_encoder_layers=2,
                                 num_decoder_layers=2, max_len=64, dropout_rate=0.1)
    config.data.source = "builtin"
    config.data.vocab_size = 1000
    config.data.tokens_per_batch = 2048  # per side, padding included (one packed shape of 32 x 64)
    config.data.max_len = 64
    config.data.pack = True
    config.data.eval_batch_size = 128
    config.data.bucket_boundaries = (64,)  # validation batches in one shape too (one compilation)
    # Validation token accuracy passes 0.98 by update 200; ~0.5-1 s an update on 2 CPU cores.
    config.train.steps = 500
    config.train.warmup_steps = 200
    config.train.lr_scale = 1.0
    config.train.log_every = 10
    config.train.eval_every = 100
    config.train.checkpoint_every = 100
    config.train.bleu_every = 500  # greedy BLEU of 500 validation pairs
    config.train.final_bleu = "beam"  # the whole validation split, beam 4, alpha 0.6 (§6.1)
    config.train.keep_checkpoints = 3
    return config
