"""The attention kernels of `ModelConfig.attention_impl`: 'xla' (jax.nn.dot_product_attention) computes what the
einsum path computes, in outputs and gradients, and 'cudnn' is refused with the rule it breaks before compiling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import cli
from transformer_jax.config import tiny
from transformer_jax.layers.attention import AttentionKernelError, check_cudnn_attention
from transformer_jax.model import Transformer
from transformer_jax.train.loss import cross_entropy_sums

# Two padded sentences and one full one.
SRC = jnp.array([[5, 6, 7, 8, 9, 2], [5, 9, 2, 0, 0, 0], [7, 2, 0, 0, 0, 0]])
TGT_IN = jnp.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0], [1, 17, 0, 0, 0]])
TARGETS = jnp.array([[11, 12, 13, 14, 2], [15, 16, 2, 0, 0], [17, 2, 0, 0, 0]])


def loss_and_grads(cfg, params, rng):
    def loss(params):
        logits = Transformer(cfg).apply({"params": params}, SRC, TGT_IN, deterministic=False, rngs={"dropout": rng})
        sums = cross_entropy_sums(logits, TARGETS, label_smoothing=0.1, pad_id=cfg.pad_id)
        return sums.loss / sums.tokens, logits

    return jax.value_and_grad(loss, has_aux=True)(params)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_xla_kernel_gives_the_einsum_outputs_and_gradients(norm_position):
    einsum = tiny(vocab_size=32, max_len=16, norm_position=norm_position, dropout_rate=0.1)
    xla = einsum.replace(attention_impl="xla")
    params = Transformer(einsum).init(jax.random.PRNGKey(0), SRC, TGT_IN)["params"]
    rng = jax.random.PRNGKey(7)  # the same residual dropout masks in both
    (loss, logits), grads = loss_and_grads(einsum, params, rng)
    (xla_loss, xla_logits), xla_grads = loss_and_grads(xla, params, rng)
    real = np.asarray(TARGETS != 0)
    np.testing.assert_allclose(np.asarray(xla_logits)[real], np.asarray(logits)[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xla_loss, loss, rtol=1e-6)
    flat, xla_flat = jax.tree.leaves(grads), jax.tree.leaves(xla_grads)
    assert len(flat) == len(xla_flat) > 10
    for grad, xla_grad in zip(flat, xla_flat):
        np.testing.assert_allclose(xla_grad, grad, rtol=1e-4, atol=1e-6)
    # The oracle is sensitive: another dropout draw moves the loss.
    (other_loss, _), _ = loss_and_grads(xla, params, jax.random.PRNGKey(8))
    assert abs(float(other_loss) - float(loss)) > 1e-4


@pytest.mark.parametrize(
    "changes, rule",
    [
        (dict(attention_impl="flash"), "attention_impl='flash' is unknown"),
        (dict(attention_impl="xla", attention_dropout_rate=0.1), "has no dropout on the attention weights"),
        (dict(attention_impl="cudnn"), "needs bfloat16 or float16 activations"),
        (dict(attention_impl="cudnn", dtype="bfloat16", d_model=96, num_heads=8), "head_dim .* a multiple of 8"),
    ],
)
def test_a_kernel_rule_broken_by_the_config_is_named(changes, rule):
    with pytest.raises(ValueError, match=rule):
        tiny(**changes)


class FakeGpu:
    platform, device_kind = "gpu", "NVIDIA A100"

    def __init__(self, compute_capability: str):
        self.compute_capability = compute_capability


def test_cudnn_needs_a_gpu_and_a_head_dim_that_gpu_takes():
    with pytest.raises(AttentionKernelError, match="needs an NVIDIA GPU, but JAX runs on cpu"):
        check_cudnn_attention(64)
    check_cudnn_attention(128, FakeGpu("8.0"))
    with pytest.raises(AttentionKernelError, match="head_dim <= 128"):
        check_cudnn_attention(256, FakeGpu("8.0"))
    check_cudnn_attention(256, FakeGpu("9.0"))  # Hopper


def test_cudnn_on_this_cpu_fails_with_one_line_through_the_cli(tmp_path, capsys):
    argv = ["train", "--config", "experiments/tiny.py", "--workdir", str(tmp_path / "run")]
    argv += ["--config.model.attention_impl=cudnn", "--config.model.dtype=bfloat16", "--config.train.steps=1"]
    argv += [
        "--config.data.options.split_sizes={'train': 200, 'validation': 8, 'test': 8}",
        "--config.data.vocab_size=120",
    ]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "attention_impl='cudnn' needs an NVIDIA GPU" in err and "Traceback" not in err
