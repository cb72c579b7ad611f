"""The paper's Table 3 (variations on the base model) at Multi30k scale: a sweep file for `transformer-jax sweep`.

    transformer-jax sweep experiments/table3.py --workdir runs/table3 --config.data.path=/path/to/multi30k
    transformer-jax sweep experiments/table3.py --workdir runs/table3 --dry-run ...   # one train command per row

The base is the shipped Multi30k model (experiments/multi30k.py: N 4+4, d_model 128, d_ff 256, h 4, d_k = d_v = 32,
P_drop 0.1, ε_ls 0.1) and every row changes it the way the paper's row changes its base (N 6, d_model 512, d_ff 2048, h
8, d_k = d_v = 64): A keeps h·d_k = d_model, B shrinks d_k alone, C scales depth and width (d_k = d_model / h), D the
regularisers, E learned positions; rows beyond the paper's, at half the peak rate (A: h 8 and h 16, C: N 6, d_model
256, and the base itself as their control), tell whether the rows that fell behind at the base's rate paid for the
rate. As in the paper every row trains the same number of updates (2,000, the warm-up of 500 included: 0.55 s an
update of the base on 2 cores of a Zen 5 EPYC, 0.8 s on a Zen 4, so 18-40 minutes a row and 10-11 hours the table,
resumable; its figures do not depend on the machine's speed, but another CPU's arithmetic moves them
about as far as another seed does) and is scored at its last update on the validation split: perplexity per target token
and beam search (§6.1: beam 4, α 0.6) without checkpoint averaging. A second seed of the base (initialisation, data
order, dropout masks, the tokenizer's sampling) shows how far a row moves by chance alone: the paper gives one run a
row. The paper's figures (newstest2013, 100K updates, PPL per wordpiece) are kept beside each row as `reference`.

Each finished row's metrics.jsonl and config.json are committed in experiments/results/table3/<row>/, with the table
built from them (`--workdir experiments/results/table3 --collect`); to go on with the table on another machine, copy
them into the sweep's workdir first (`cp -r experiments/results/table3/. runs/table3/`): the sweep skips those rows.
"""

from transformer_jax.sweep import Sweep, SweepRow

UPDATES = 2000


def row(group: str, name: str, paper_ppl: float, paper_bleu: float, paper_params_m: float | None = None, **changes):
    reference = {"ppl": paper_ppl, "bleu": paper_bleu}
    if paper_params_m is not None:
        reference["params_m"] = paper_params_m
    return SweepRow(name, {f"model.{key}": value for key, value in changes.items()}, group, reference)


def get_sweep() -> Sweep:
    layers = lambda n: dict(num_encoder_layers=n, num_decoder_layers=n)  # noqa: E731
    return Sweep(
        config="multi30k.py",
        title=f"Table 3 at Multi30k scale: every row {UPDATES:,} updates, validation split, beam 4, α 0.6",
        overrides={
            "data.bucket_boundaries": (16, 24, 32, 48, 128),  # the buckets multi30k.py had when the table began
            "train.steps": UPDATES,
            "train.max_minutes": 0,  # updates, not minutes, end each row
            "train.eval_every": 500,
            "train.checkpoint_every": 500,
            "train.keep_checkpoints": 2,
            "train.bleu_every": 0,
            "train.final_bleu": "beam",
        },
        rows=(
            row("base", "base", 4.92, 25.8, 65),
            SweepRow("base, seed 1", {"train.seed": 1}, "base"),  # how far a row moves by chance alone
            row("A", "A: h 1, d_k 128", 5.29, 24.9, num_heads=1),
            row("A", "A: h 2, d_k 64", 5.00, 25.5, num_heads=2),
            row("A", "A: h 8, d_k 16", 4.91, 25.8, num_heads=8),
            row("A", "A: h 16, d_k 8", 5.01, 25.4, num_heads=16),
            # Not in the paper: h 8 and h 16 at half the peak rate, since both fell behind once the rate peaked.
            SweepRow("A: h 8, half peak rate", {"model.num_heads": 8, "optimizer.lr_scale": 0.625}, "A"),
            SweepRow("A: h 16, half peak rate", {"model.num_heads": 16, "optimizer.lr_scale": 0.625}, "A"),
            row("B", "B: d_k 8", 5.16, 25.1, 58, key_dim=8, value_dim=32),
            row("B", "B: d_k 16", 5.01, 25.4, 60, key_dim=16, value_dim=32),
            row("C", "C: N 2", 6.11, 23.7, 36, **layers(2)),
            row("C", "C: N 6", 4.88, 25.5, 80, **layers(6)),
            # Not in the paper: N 6 at half the base's peak learning rate (post-LN depth and a high rate, Liu et al.
            # 2020), since N 6 at the base's 4.9e-3 stopped learning at a unigram loss from update ~200; and the base
            # at half the rate, what N 6 at half the rate is to be read against.
            SweepRow(
                "C: N 6, half peak rate",
                {"model.num_encoder_layers": 6, "model.num_decoder_layers": 6, "optimizer.lr_scale": 0.625},
                "C",
            ),
            SweepRow("C: N 4, half peak rate", {"optimizer.lr_scale": 0.625}, "C"),
            row("C", "C: d_model 64", 5.75, 24.5, 28, d_model=64),
            row("C", "C: d_model 256", 4.66, 26.0, 168, d_model=256),
            # Not in the paper: d_model 256 at half the peak rate, since at the base's rate it learned more slowly
            # than the base from update ~550 on, just after its rate peaked.
            SweepRow("C: d_model 256, half peak rate", {"model.d_model": 256, "optimizer.lr_scale": 0.625}, "C"),
            row("C", "C: d_ff 128", 5.12, 25.4, 53, d_ff=128),
            row("C", "C: d_ff 512", 4.75, 26.2, 90, d_ff=512),
            row("D", "D: P_drop 0.0", 5.77, 24.6, dropout_rate=0.0),
            row("D", "D: P_drop 0.2", 4.95, 25.5, dropout_rate=0.2),
            SweepRow("D: eps_ls 0.0", {"train.label_smoothing": 0.0}, "D", {"ppl": 4.67, "bleu": 25.3}),
            SweepRow("D: eps_ls 0.2", {"train.label_smoothing": 0.2}, "D", {"ppl": 5.47, "bleu": 25.7}),
            row("E", "E: learned positions", 4.92, 25.7, position_encoding="learned"),
        ),
    )
