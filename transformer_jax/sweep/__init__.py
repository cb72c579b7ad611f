"""Sweeps: one base experiment, named rows of config overrides, one workdir per row, one table of the results.

A sweep file is a Python file whose `get_sweep()` returns a `Sweep` (experiments/table3.py):

    Sweep(config="multi30k.py", overrides={"train.steps": 2000},             # the base, for every row
          rows=(SweepRow("base"), SweepRow("A h 1", {"model.num_heads": 1}, group="A")))

`transformer-jax sweep FILE --workdir DIR` trains each row in DIR/<row> (a finished row is skipped, an interrupted one
resumed) and writes DIR/table.{md,csv,json,png} of every row, again after each row it trains; `--rows` runs only the
rows it names. SIGTERM / SIGINT stop it as they stop `train` (the row's checkpoint saved, exit 143 / 130), with the
table of the rows finished; the same command resumes. Rows are compared at equal updates, so a row with a time budget
(train.max_minutes) is refused. A row is scored as the paper's Table 3 is, by the training run itself (or as it would,
from its workdir, when it stopped before) on the validation split at its last update: perplexity per target token and
BLEU of beam search (the experiment's decode section), no checkpoint averaging. `--dry-run` prints each row's
`transformer-jax train` command (for separate hosts, jobs or a SLURM array); `--collect` builds the table from the row
workdirs as they are. The table gives each row's change from the first row (perplexity in %, BLEU in points; ours and
the paper's), so the first row is the one the others change, and other rows in its group are its repeats (other seeds):
the plot shades the spread they show, what chance alone moves a row. The overrides are applied as `--config.KEY=VALUE`
would be: the sweep's, then the command line's, then the row's. Each row names the CPU it trained on (a row resumed on
another machine, both): its minutes compare with another row's only on one CPU.

    planning.py  the sweep file; its rows resolved to experiments and workdirs; --rows; --dry-run's commands
    training.py  each row trained (or resumed) in turn, finished ones skipped
    score.py     a row whose run stopped before scoring its last update, scored from its workdir
    results.py   a row's result and validation curve, read from its run log
    report.py    the table (md, csv, json) and its plots
"""

from transformer_jax.sweep.planning import PlannedRow, Sweep, SweepRow, plan, select, train_command
from transformer_jax.sweep.report import plot_limit, write_table
from transformer_jax.sweep.results import row_result, train_minutes, validation_curve
from transformer_jax.sweep.training import RowInterrupted, run

__all__ = [
    "PlannedRow",
    "RowInterrupted",
    "Sweep",
    "SweepRow",
    "plan",
    "plot_limit",
    "row_result",
    "run",
    "select",
    "train_command",
    "train_minutes",
    "validation_curve",
    "write_table",
]
