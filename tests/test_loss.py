"""Label-smoothed cross-entropy against a hand computation and PyTorch (paper §5.4)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.train.loss import cross_entropy_sums, smoothed_targets, summarize

# batch 1, length 3, vocabulary 4 (ids 0..3, 0 = pad); the last position is padding.
LOGITS = [[[0.0, 1.0, 2.0, 3.0], [2.0, 0.0, 0.0, -1.0], [5.0, 5.0, 5.0, 5.0]]]
TARGETS = [[3, 1, 0]]


def hand_loss(eps):
    """Per token: -(1-eps) log p(gold) - eps/4 * sum_v log p(v), written out for the two real tokens."""
    total_smoothed = total_nll = 0.0
    for row, gold in ((LOGITS[0][0], 3), (LOGITS[0][1], 1)):
        log_z = math.log(sum(math.exp(x) for x in row))
        log_p = [x - log_z for x in row]
        nll = -log_p[gold]
        total_nll += nll
        total_smoothed += (1 - eps) * nll + eps / 4 * -sum(log_p)
    return total_smoothed, total_nll


def test_smoothed_distribution_is_one_minus_eps_on_gold_plus_eps_over_v():
    q = np.asarray(smoothed_targets(jnp.array([2]), 4, 0.1))[0]
    np.testing.assert_allclose(q, [0.025, 0.025, 0.925, 0.025], rtol=1e-6)
    assert q.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_hand_computation_pads_excluded(eps):
    sums = cross_entropy_sums(jnp.array(LOGITS), jnp.array(TARGETS), label_smoothing=eps, pad_id=0)
    smoothed, nll = hand_loss(eps)
    assert float(sums.tokens) == 2.0
    assert float(sums.loss) == pytest.approx(smoothed, rel=1e-6)
    assert float(sums.nll) == pytest.approx(nll, rel=1e-6)
    assert float(sums.correct) == 1.0  # argmax of row 0 is 3 (right), of row 1 is 0 (wrong)
    means = summarize(sums)
    assert means["loss"] == pytest.approx(smoothed / 2, rel=1e-6)
    assert means["perplexity"] == pytest.approx(math.exp(nll / 2), rel=1e-6)
    assert means["accuracy"] == 0.5


def test_known_value_eps_0_1():
    # Worked by hand: row 0 log Z = 3.440190, NLL = 0.440190, sum_v -log p(v) = 7.760759;
    # row 1 log Z = 2.277978, NLL = 2.277978, sum_v -log p(v) = 8.111913.
    sums = cross_entropy_sums(jnp.array(LOGITS), jnp.array(TARGETS), label_smoothing=0.1)
    assert float(sums.nll) == pytest.approx(0.440190 + 2.277978, abs=1e-5)
    assert float(sums.loss) == pytest.approx(0.9 * 2.718168 + 0.025 * (7.760759 + 8.111913), abs=1e-5)


def test_bfloat16_logits_are_promoted_to_float32():
    sums = cross_entropy_sums(jnp.array(LOGITS, jnp.bfloat16), jnp.array(TARGETS), label_smoothing=0.1)
    assert sums.loss.dtype == jnp.float32


def test_matches_torch_cross_entropy_label_smoothing():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
    targets = rng.integers(0, 11, size=(3, 5))
    targets[0, 3:] = 0
    sums = cross_entropy_sums(jnp.array(logits), jnp.array(targets), label_smoothing=0.1, pad_id=0)
    expected = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0, reduction="sum")(
        torch.from_numpy(logits).reshape(-1, 11), torch.from_numpy(targets).reshape(-1)
    )
    assert float(sums.loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(sums.tokens) == float((targets != 0).sum())


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_hand_written_gradient_matches_autodiff_of_log_softmax(eps):
    """The fused backward (p - q on real tokens) against autodiff of the textbook formula, for loss and NLL."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(2, 4, 9)).astype(np.float32))
    targets = jnp.asarray([[3, 1, 0, 0], [5, 8, 2, 0]])

    def textbook(x):
        log_p = jax.nn.log_softmax(x, axis=-1)
        mask = (targets != 0).astype(jnp.float32)
        nll = -jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(((1 - eps) * nll - eps * jnp.mean(log_p, axis=-1)) * mask), jnp.sum(nll * mask)

    for index, name in ((0, "loss"), (1, "nll")):
        ours = jax.grad(lambda x: getattr(cross_entropy_sums(x, targets, label_smoothing=eps), name))(logits)
        oracle = jax.grad(lambda x: textbook(x)[index])(logits)
        np.testing.assert_allclose(ours, oracle, atol=1e-6)
    assert float(jnp.abs(ours[0, 2:]).max()) == 0.0  # pad positions get no gradient


def test_gradient_matches_torch_cross_entropy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 5))
    ours = jax.grad(lambda x: cross_entropy_sums(x, jnp.asarray(targets), label_smoothing=0.1).loss)(
        jnp.asarray(logits)
    )
    reference = torch.from_numpy(logits).requires_grad_()
    torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0, reduction="sum")(
        reference.reshape(-1, 7), torch.from_numpy(targets).reshape(-1)
    ).backward()
    np.testing.assert_allclose(ours, reference.grad.numpy(), atol=1e-6)
