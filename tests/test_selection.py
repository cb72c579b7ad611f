"""Checkpoints kept and chosen by a validation metric: ranking, retention across a resume, `average --best`,
`--checkpoint best`, and the config check that every checkpoint step has the metric."""

import jax
import numpy as np
import pytest
from conftest import tiny_run_overrides
from test_checkpoint import make_state

from transformer_jax import cli
from transformer_jax.checkpoint import Checkpointer
from transformer_jax.experiment import ConfigError, TrainConfig, load_experiment
from transformer_jax.run_log import read_rows
from transformer_jax.selection import best_steps, validation_scores
from transformer_jax.train import loop
from transformer_jax.workdir import average_best, load_params


def test_best_steps_ranks_by_the_metric_ties_to_the_later_step():
    perplexity = {200: 6.1, 400: 5.9, 600: 5.9, 800: 6.3}
    assert best_steps(perplexity, [200, 400, 600, 800, 1000], 2, "perplexity") == [400, 600]
    assert best_steps(perplexity, [200, 400, 600, 800, 1000], 1, "perplexity") == [600]
    assert best_steps(perplexity, [200, 800], 5, "perplexity") == [200, 800]  # only kept steps, fewer than k
    bleu = {200: 30.0, 400: 31.5, 600: 29.0}
    assert best_steps(bleu, [200, 400, 600], 2, "bleu") == [200, 400]  # higher is better


def test_the_best_survive_rotation_and_a_new_manager(tmp_path):
    """keep 1 latest + keep_best 2 lowest perplexity; a second manager (a resumed run) ranks the first one's
    checkpoints with its own: the kept steps are always the latest plus the two lowest of all saved so far."""
    perplexity = {1: 9.0, 2: 5.0, 3: 7.0, 4: 6.0, 5: 8.0, 6: 4.0, 7: 9.5, 8: 5.5}
    state = make_state()
    saved = {}
    for steps in ([1, 2, 3, 4], [5, 6, 7, 8]):
        checkpointer = Checkpointer(tmp_path, keep=1, keep_best=2, best_metric="perplexity", best_mode="min")
        for step in steps:
            checkpointer.save(step, state, metrics={"perplexity": perplexity[step]})
            saved[step] = perplexity[step]
            checkpointer.wait()
            lowest = sorted(saved, key=saved.get)[:2]
            assert checkpointer.all_steps() == sorted({step, *lowest}), step
        checkpointer.close()
    unranked = Checkpointer(tmp_path, keep=1, keep_best=2)
    unranked.save(9, state)  # no validation at this step: kept while it is the latest
    unranked.wait()
    assert unranked.all_steps() == [2, 6, 9]
    unranked.close()


def test_keep_best_needs_a_validation_at_every_checkpoint():
    TrainConfig(keep_best=4, eval_every=200, checkpoint_every=400)
    with pytest.raises(ConfigError, match=r"train.eval_every=300 does not divide train.checkpoint_every=400"):
        TrainConfig(keep_best=4, eval_every=300, checkpoint_every=400)
    with pytest.raises(ConfigError, match=r"--config.train.bleu_every=400"):
        TrainConfig(keep_best=4, best_metric="bleu", bleu_every=0, checkpoint_every=400)


def test_a_run_keeps_its_best_checkpoints_and_averages_them(tmp_path):
    changes = {"train.eval_every": 2, "train.checkpoint_every": 2, "train.keep_checkpoints": 1, "train.keep_best": 2}
    changes |= {"train.bleu_every": 0, "optimizer.warmup_steps": 2, "optimizer.lr_scale": 4.0}
    loop.train(load_experiment("experiments/tiny.py", tiny_run_overrides(12, **changes)), tmp_path)
    scores = validation_scores(read_rows(tmp_path), "perplexity")
    assert sorted(scores) == [2, 4, 6, 8, 10, 12]
    lowest = sorted(sorted(scores), key=lambda step: (scores[step], -step))[:2]  # brute force over the log
    kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == sorted({12, *lowest})

    steps, _ = average_best(tmp_path, 2, "perplexity")
    assert steps == sorted(lowest)
    mean = jax.tree.map(lambda a, b: (np.float64(a) + np.float64(b)) / 2, *(load_params(tmp_path, s) for s in steps))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), load_params(tmp_path, "averaged"), mean)
    best = min(lowest, key=lambda step: (scores[step], -step))
    jax.tree.map(np.testing.assert_array_equal, load_params(tmp_path, "best"), load_params(tmp_path, best))
    assert cli.main(["average", "--workdir", str(tmp_path), "--best", "0"]) == 2
