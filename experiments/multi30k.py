"""Multi30k task 1 (29k caption pairs), EN→DE by default: the small Transformer, trained on a time budget.

    transformer-jax train --config experiments/multi30k.py --workdir runs/m30k \\
        --config.data.path=/path/to/multi30k [--config.data.target_lang=fr]

/path/to/multi30k: a directory holding the task 1 files train / val / test_2016_flickr .en / .de / .fr, one sentence
a line (README.md, "Data where you keep it").

The model of the published small-Transformer recipe (fairseq: 4+4 layers, d_model 128, d_ff 256, 4 heads, shared
vocabulary, label smoothing 0.1) with dropout 0.1 instead of its 0.3: a CPU budget sees about a third of the
reference's tokens, and both 0.3 and 0.2 stalled in that budget (validation perplexity 20 and 17 after 2,000
updates, against 7.7 with 0.1), although 0.1 overfits after ~4,000 updates; dropout 0.2 at half the peak learning
rate learns, reaches a lower validation perplexity (5.67 against 6.01) but the same test BLEU in 85 minutes
(experiments/results/multi30k.md, run E), and a case-folded vocabulary (data.tokenizer_normalization='nmt_nfkc_cf',
run F) scored 39.3 lowercased BLEU against 39.5, BPE-dropout 0.05 (data.tokenizer_sampling) stalled like dropout 0.2
(probe L); the published recipe itself (dropout 0.3, warm-up 2,000 to 5e-3, 8k-position batches, run I) learns, but
at half C's pace per minute (validation BLEU 30 after 40 minutes). On one AMD EPYC, 2+2 layers (run P: 10,422 updates,
best validation perplexity by update 3,800) and attention + ReLU dropout 0.1 (run Q: perplexity 5.89 against 6.04)
both scored 39.3 against this recipe's 40.3 (run M). The paper's warm-up / inverse-square-root
schedule (§5.3) needs no horizon, so a run stopped by `train.max_minutes` ends on a sensible learning rate. Batches:
about 4k source + 4k target positions each, in ten length buckets (every 4 tokens from 12 to 32, then 40, 48, 64,
128; most captions take 12-24): 84% of the positions are real tokens, against 76% with the earlier five (16, 24, 32,
48, 128), which is 9% more real tokens a second at the same cost an update (experiments/bench/train_throughput.py)
for about 10 s more compiling. Checkpoints every 200 updates, each with its validation perplexity; the run keeps the
16 best by it (and the latest), and experiments/multi30k.sh averages the best 8, so a run that overfits late
(dropout 0.1 does after ~5,500 updates on a fast machine) is averaged where validation was best, not where the
budget happened to end.
"""

from transformer_jax.config import base
from transformer_jax.experiment import DataConfig, Experiment, OptimizerConfig, TrainConfig


def get_config() -> Experiment:
    return Experiment(
        model=base(
            d_model=128,
            num_heads=4,
            d_ff=256,
            num_encoder_layers=4,
            num_decoder_layers=4,
            dropout_rate=0.1,
            max_len=128,
        ),
        data=DataConfig(
            source="multi30k",
            path="",  # required: --config.data.path=/path/to/multi30k (train.en, train.de, val.*, ...)
            source_lang="en",
            target_lang="de",
            vocab_size=8000,
            tokens_per_batch=4096,  # per side, padding included
            max_len=128,
            pack=False,
            bucket_boundaries=(12, 16, 20, 24, 28, 32, 40, 48, 64, 128),
            eval_batch_size=128,
        ),
        optimizer=OptimizerConfig(
            warmup_steps=500,
            lr_scale=1.25,  # peak lr 1.25 * 128^-0.5 * 500^-0.5 = 4.9e-3 at update 500
        ),
        train=TrainConfig(
            steps=100_000,  # the time budget ends the run
            max_minutes=80.0,  # tokenizer, compiling, training and validation
            log_every=50,
            eval_every=200,  # validation perplexity at every checkpoint (about 2 s each): the checkpoints are ranked
            checkpoint_every=200,
            keep_checkpoints=2,  # the latest, to resume from
            keep_best=16,  # and the 16 of lowest validation perplexity: multi30k.sh averages the best 8
            bleu_every=1000,  # greedy BLEU of 500 validation pairs (the learning curve)
            final_bleu="none",  # multi30k.sh scores the averaged model on the test split
        ),
    )
