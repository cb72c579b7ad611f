"""Number-for-number parity with the PyTorch reference (transformer_jax.interop.torch), float32.

Same weights and inputs (with padding) in both frameworks: encoder outputs and logits at real positions,
all parameter gradients, the label-smoothed loss, one Adam step with the §5.3 schedule and greedy tokens.
The worst absolute differences are printed (run with -s to see them). Skipped where torch is absent.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

torch = pytest.importorskip("torch")

from transformer_jax.config import tiny  # noqa: E402
from transformer_jax.experiment import OptimizerConfig  # noqa: E402
from transformer_jax.interop import torch as interop  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

ATOL = 1e-5  # float32 parity: the largest absolute JAX-PyTorch difference allowed (per token for summed losses)
# Paper constants (§5.3 Adam and schedule, §5.4 label smoothing), as the training config presets hold them.
ADAM_B1, ADAM_B2, ADAM_EPS, WARMUP_STEPS, LABEL_SMOOTHING = 0.9, 0.98, 1e-9, 4000, 0.1

# [batch=3, src_len=9] and [batch=3, tgt_len=7]; pad_id=0, bos_id=1, eos_id=2; right-padded, no empty rows.
SRC = np.array([[5, 9, 12, 7, 30, 44, 17, 8, 2], [8, 4, 61, 23, 2, 0, 0, 0, 0], [33, 2, 0, 0, 0, 0, 0, 0, 0]])
TGT_IN = np.array([[1, 40, 41, 42, 43, 20, 21], [1, 17, 18, 19, 0, 0, 0], [1, 50, 0, 0, 0, 0, 0]])
TGT_OUT = np.array([[40, 41, 42, 43, 20, 21, 2], [17, 18, 19, 2, 0, 0, 0], [50, 2, 0, 0, 0, 0, 0]])

VARIANTS = {
    "post_nobias_sinusoid": dict(),  # the paper's model
    # One layer per stack in the variants (compile time); the paper's variant keeps two.
    "pre_bias_halves_eps1e-5": dict(
        norm_position="pre",
        attention_bias=True,
        sinusoid_layout="halves",
        layer_norm_epsilon=1e-5,
        num_encoder_layers=1,
        num_decoder_layers=1,
    ),
    "post_bias_learned_unshared": dict(
        attention_bias=True,
        position_encoding="learned",
        share_embeddings=False,
        num_encoder_layers=1,
        num_decoder_layers=1,
    ),
}


def small_config(**overrides):
    values = dict(
        vocab_size=64,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        max_len=32,
        dropout_rate=0.0,
    )
    return tiny(**{**values, **overrides})


_CACHE: dict = {}


def random_params(cfg, seed=0):
    """Flax params drawn in numpy from the interop map's shapes (no jitted init: keeps the suite fast).

    Kernels ~ N(0, 1/fan_in), embeddings ~ N(0, 1/d_model), LayerNorm scales 1 + N(0, 0.1^2), biases
    N(0, 0.1^2) (non-zero, so that every mapped tensor matters). `test_map_matches_the_model_tree` checks
    these shapes against the model's own.
    """
    rng = np.random.default_rng(seed)
    flat = {}
    for entry in interop.parameter_map(cfg):
        for path, shape in zip(entry.flax_paths, entry.flax_shapes):
            if path.endswith("/scale"):
                value = 1.0 + 0.1 * rng.standard_normal(shape)
            elif path.endswith("/bias"):
                value = 0.1 * rng.standard_normal(shape)
            elif path.endswith(("embedding", "output_projection/kernel")):
                value = rng.standard_normal(shape) * cfg.d_model**-0.5
            else:
                fan_in = shape[0] * (shape[1] if path.endswith("out/kernel") else 1)
                value = rng.standard_normal(shape) * fan_in**-0.5
            flat[tuple(path.split("/"))] = jnp.asarray(value, jnp.float32)
    return traverse_util.unflatten_dict(flat)


def build(name: str):
    """(config, flax model, params, torch model with the same weights), cached per variant."""
    if name not in _CACHE:
        cfg = small_config(**VARIANTS[name])
        params = random_params(cfg)
        torch_model = interop.TorchTransformer(cfg)
        torch_model.load_state_dict(interop.flax_to_torch_state_dict(params, cfg), strict=True)
        _CACHE[name] = (cfg, Transformer(cfg), params, torch_model)
    return _CACHE[name]


def jax_results(name: str):
    """One jitted pass per variant: encoder output, logits, the smoothed loss (mean over real tokens, as
    train/step.py applies it) and its gradients."""
    key = ("jax", name)
    if key not in _CACHE:
        from transformer_jax.train import loss as loss_module

        _, model, params, _ = build(name)

        def loss_and_outputs(p):
            def encode_and_decode(module, inputs, decoder_inputs):
                encoded = module.encode(inputs)  # [batch, src_len, d_model]
                return encoded, module.decode(encoded, inputs, decoder_inputs)  # logits [batch, tgt_len, vocab]

            encoded, logits = model.apply({"params": p}, SRC, TGT_IN, method=encode_and_decode)
            sums = loss_module.cross_entropy_sums(
                logits, TGT_OUT, label_smoothing=LABEL_SMOOTHING, pad_id=model.config.pad_id
            )
            return sums.loss / sums.tokens, (encoded, logits)

        (loss, (encoded, logits)), grads = jax.jit(jax.value_and_grad(loss_and_outputs, has_aux=True))(params)
        _CACHE[key] = dict(loss=float(loss), encoded=np.asarray(encoded), logits=np.asarray(logits), grads=grads)
    return _CACHE[key]


@contextlib.contextmanager
def fastpath(enabled: bool):
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def report(what: str, value: float):
    print(f"[parity] {what}: worst |diff| = {value:.3e}")


# ------------------------------------------------------------------------------------------ conversion


@pytest.mark.parametrize("name", list(VARIANTS))
def test_map_matches_the_model_tree(name):
    from transformer_jax.accounting import parameter_shapes  # jax.eval_shape of Transformer.init

    cfg, _, params, _ = build(name)
    expected = {path: leaf.shape for path, leaf in traverse_util.flatten_dict(parameter_shapes(cfg)).items()}
    assert {path: leaf.shape for path, leaf in traverse_util.flatten_dict(params).items()} == expected


@pytest.mark.parametrize("name", list(VARIANTS))
def test_round_trip_is_bitwise_exact(name):
    cfg, _, params, torch_model = build(name)
    state_dict = interop.flax_to_torch_state_dict(params, cfg)
    assert set(state_dict) == set(torch_model.state_dict())  # no extra or missing keys for load_state_dict
    back = interop.torch_to_flax_params(state_dict, cfg)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    again = interop.flax_to_torch_state_dict(back, cfg)
    assert all(torch.equal(state_dict[key], again[key]) for key in state_dict)


def test_in_proj_packs_query_key_value_in_order():
    cfg, _, params, _ = build("pre_bias_halves_eps1e-5")
    state_dict = interop.flax_to_torch_state_dict(params, cfg)
    attention = params["encoder"]["layer_0"]["self_attention"]
    d = cfg.d_model
    packed = state_dict["encoder.layers.0.self_attn.in_proj_weight"].numpy()  # [3 d, d]
    for index, name in enumerate(("query", "key", "value")):
        np.testing.assert_array_equal(
            packed[index * d : (index + 1) * d], np.asarray(attention[name]["kernel"]).reshape(d, d).T
        )
        np.testing.assert_array_equal(
            state_dict["encoder.layers.0.self_attn.in_proj_bias"].numpy()[index * d : (index + 1) * d],
            np.asarray(attention[name]["bias"]).reshape(d),
        )


def test_mismatches_name_the_parameter():
    cfg, _, params, _ = build("post_nobias_sinusoid")
    state_dict = interop.flax_to_torch_state_dict(params, cfg)
    missing = dict(state_dict)
    del missing["decoder.layers.1.norm3.bias"]
    with pytest.raises(interop.ConversionError, match=r"missing torch parameters: decoder\.layers\.1\.norm3\.bias"):
        interop.torch_to_flax_params(missing, cfg)
    extra = dict(state_dict, **{"encoder.layers.0.self_attn.in_proj_bias": torch.zeros(3 * cfg.d_model)})
    with pytest.raises(
        interop.ConversionError, match=r"unexpected torch parameters: encoder\.layers\.0\.self_attn\.in_proj_bias"
    ):
        interop.torch_to_flax_params(extra, cfg)
    wrong = dict(state_dict, **{"encoder.layers.0.linear1.weight": torch.zeros(7, cfg.d_model)})
    with pytest.raises(interop.ConversionError, match=r"'encoder\.layers\.0\.linear1\.weight' has shape \(7, 32\)"):
        interop.torch_to_flax_params(wrong, cfg)
    with pytest.raises(interop.ConversionError, match=r"'encoder/layer_0/ffn/wi/kernel' has shape \(32, 64\)"):
        interop.flax_to_torch_state_dict(params, cfg.replace(d_ff=128))
    with pytest.raises(interop.ConversionError, match=r"missing Flax parameters: .*encoder/final_norm/bias"):
        interop.flax_to_torch_state_dict(params, cfg.replace(norm_position="pre"))
    with pytest.raises(interop.ConversionError, match=r"unexpected Flax parameters: .*self_attention/out/bias"):
        interop.flax_to_torch_state_dict(build("pre_bias_halves_eps1e-5")[2], cfg.replace(norm_position="pre"))


@pytest.mark.parametrize("sizes", [dict(key_dim=8), dict(value_dim=32), dict(key_dim=8, value_dim=24)])
def test_keys_or_values_unlike_d_model_over_heads_are_refused_before_any_work(tmp_path, sizes):
    """nn.MultiheadAttention has d_k = d_v = d_model / h: no torch model holds these, so nothing is read or made
    (the params here are not even a tree, the file does not exist)."""
    cfg = tiny(**sizes)
    message = r"ModelConfig\.key_dim=.* \(d_k=.*\) and value_dim=.* \(d_v=.*\)"
    with pytest.raises(interop.ConversionError, match=message):
        interop.export_torch_state_dict(object(), cfg, tmp_path / "model.pt")
    with pytest.raises(interop.ConversionError, match=message):
        interop.import_torch_state_dict(tmp_path / "missing.pt", cfg)
    assert not (tmp_path / "model.pt").exists()
    explicit = tiny(key_dim=cfg.head_dim, value_dim=cfg.head_dim)  # the defaults spelled out convert
    assert len(interop.parameter_map(explicit)) == len(interop.parameter_map(tiny()))


def test_export_and_import_through_a_file(tmp_path):
    cfg, model, params, _ = build("post_bias_learned_unshared")
    path = tmp_path / "nested" / "model.pt"
    interop.export_torch_state_dict({"params": params}, cfg, path)
    loaded = torch.load(path, weights_only=True)
    reference = interop.TorchTransformer(cfg)
    reference.load_state_dict(loaded, strict=True)  # a plain state_dict, usable from torch alone
    back = interop.import_torch_state_dict(path, cfg)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    torch.save({"state_dict": loaded, "step": 3}, tmp_path / "checkpoint.pt")  # a training checkpoint
    back = interop.import_torch_state_dict(tmp_path / "checkpoint.pt", cfg)
    assert np.array_equal(
        np.asarray(back["target_embed"]["embedding"]), np.asarray(params["target_embed"]["embedding"])
    )
    with pytest.raises(interop.ConversionError, match="missing torch parameters"):
        interop.import_torch_state_dict(path, cfg.replace(share_embeddings=True))


def test_interop_package_imports_without_touching_torch():
    import importlib
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` fail
        "import transformer_jax.interop as i\n"
        "try:\n    i.export_torch_state_dict\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'transformer-jax[torch]'" in out
    assert importlib.import_module("transformer_jax.interop").__all__


# ------------------------------------------------------------------------------------------ forward


def real(tokens):
    return tokens != 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_encoder_outputs_and_logits_agree(name):
    _, _, _, torch_model = build(name)
    results = jax_results(name)
    torch_model.eval()
    src, tgt = torch.as_tensor(SRC), torch.as_tensor(TGT_IN)
    for enabled in (False, True):  # torch's eval fast path (taken with attention biases) agrees at real tokens
        with fastpath(enabled), torch.no_grad():
            torch_encoded = torch_model.encode(src).numpy()
            torch_logits = torch_model(src, tgt).numpy()
        encoder_diff = np.abs(results["encoded"] - torch_encoded)[real(SRC)].max()
        logits_diff = np.abs(results["logits"] - torch_logits)[real(TGT_IN)].max()
        report(f"{name} fastpath={enabled} encoder", encoder_diff)
        report(f"{name} fastpath={enabled} logits", logits_diff)
        assert encoder_diff < ATOL and logits_diff < ATOL


# ------------------------------------------------------------------------------------------ loss, grads, step


def torch_loss(torch_model, label_smoothing):
    logits = torch_model(torch.as_tensor(SRC), torch.as_tensor(TGT_IN))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=0)  # mean over non-pad
    return criterion(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(TGT_OUT).reshape(-1))


@pytest.mark.parametrize("label_smoothing", [0.0, LABEL_SMOOTHING, 0.3])
def test_label_smoothed_loss_agrees_with_cross_entropy_loss(label_smoothing):
    """Our sums / tokens == CrossEntropyLoss(label_smoothing=eps, ignore_index=pad) (mean over non-pad):
    both use q = (1 - eps) onehot + eps / V over the whole vocabulary (pad included), no entropy shift."""
    from transformer_jax.train.loss import cross_entropy_sums, summarize

    logits = np.array(jax_results("post_nobias_sinusoid")["logits"])  # the same logits in both: the loss alone
    sums = cross_entropy_sums(jnp.asarray(logits), jnp.asarray(TGT_OUT), label_smoothing=label_smoothing, pad_id=0)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=0)
    expected = criterion(torch.as_tensor(logits).reshape(-1, logits.shape[-1]), torch.as_tensor(TGT_OUT).reshape(-1))
    summed = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=0, reduction="sum")(
        torch.as_tensor(logits).reshape(-1, logits.shape[-1]), torch.as_tensor(TGT_OUT).reshape(-1)
    )
    got = summarize(sums)["loss"]
    report(f"loss eps={label_smoothing}", abs(got - expected.item()))
    assert abs(got - expected.item()) < ATOL
    assert abs(float(sums.loss) - summed.item()) < ATOL * float(sums.tokens)
    assert float(sums.tokens) == (TGT_OUT != 0).sum()


def torch_grads(torch_model):
    torch_model.train()  # dropout rates are 0: train mode only changes the code path (no fast path)
    torch_model.zero_grad()
    value = torch_loss(torch_model, LABEL_SMOOTHING)
    value.backward()
    return value.item(), {key: p.grad.clone() for key, p in torch_model.named_parameters()}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gradients_agree_for_every_parameter(name):
    cfg, _, _, torch_model = build(name)
    results = jax_results(name)
    torch_value, expected = torch_grads(torch_model)
    grads = interop.flax_to_torch_state_dict(results["grads"], cfg)  # gradients converted like parameters
    assert set(grads) == set(expected)
    worst = {key: (grads[key] - expected[key]).abs().max().item() for key in grads}
    key = max(worst, key=worst.get)
    report(f"{name} loss", abs(results["loss"] - torch_value))
    report(f"{name} grads (at {key})", worst[key])
    assert abs(results["loss"] - torch_value) < ATOL
    assert worst[key] < ATOL, f"{key}: {worst[key]}"
    assert min(g.abs().max().item() for g in grads.values()) > 0  # every parameter gets a gradient


def paper_lr(step: int, d_model: int) -> float:
    """§5.3: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    return d_model**-0.5 * min(step**-0.5, step * WARMUP_STEPS**-1.5)


@pytest.mark.rounding
def test_one_adam_step_with_the_paper_schedule_gives_the_same_parameters():
    import optax

    from transformer_jax.train import optimizer

    name = "post_nobias_sinusoid"
    cfg, _, params, _ = build(name)
    settings = OptimizerConfig(warmup_steps=WARMUP_STEPS, adam_b1=ADAM_B1, adam_b2=ADAM_B2, adam_eps=ADAM_EPS)
    tx, schedule = optimizer.make_optimizer(settings, cfg.d_model)
    grads = jax_results(name)["grads"]

    @jax.jit
    def adam_step(params, grads):
        updates, _ = tx.update(grads, tx.init(params), params)
        return optax.apply_updates(params, updates)

    new_params = interop.flax_to_torch_state_dict(adam_step(params, grads), cfg)

    reference = interop.TorchTransformer(cfg)
    reference.load_state_dict(interop.flax_to_torch_state_dict(params, cfg))
    before = {key: p.detach().clone() for key, p in reference.named_parameters()}
    adam = torch.optim.Adam(reference.parameters(), lr=1.0, betas=(ADAM_B1, ADAM_B2), eps=ADAM_EPS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(adam, lambda epoch: paper_lr(epoch + 1, cfg.d_model))
    adam.zero_grad()
    torch_grads(reference)
    adam.step()
    scheduler.step()

    lr = paper_lr(1, cfg.d_model)
    assert float(schedule(0)) == pytest.approx(lr, rel=1e-6)
    assert float(schedule(1)) == pytest.approx(scheduler.get_last_lr()[0], rel=1e-6)  # step 2 agrees too
    worst_param = max((new_params[key] - p.detach()).abs().max().item() for key, p in reference.named_parameters())
    worst_delta = max(
        ((new_params[key] - before[key]) - (p.detach() - before[key])).abs().max().item()
        for key, p in reference.named_parameters()
    )
    report("post-step params", worst_param)
    report(f"post-step update (lr={lr:.3e})", worst_delta)
    assert worst_param < ATOL
    # Adam's first step is lr * g / (|g| + eps): every update is at most lr; gradients within ~1e-9 of zero
    # may differ in relative terms, so the updates agree to within lr, not to float precision.
    assert worst_delta <= lr
    # Where |g| >> eps the update is -lr * sign(g): both frameworks must move those entries by lr (to the
    # float32 resolution of param + update, about 1% of lr here), so a missing or wrong update fails.
    for key, p in reference.named_parameters():
        clear = p.grad.abs() > 1e-6
        if not clear.any():
            continue
        torch_update = (p.detach() - before[key])[clear]
        jax_update = (new_params[key] - before[key])[clear]
        assert torch_update.abs().min().item() > 0.9 * lr, key  # the reference did step
        assert (jax_update - torch_update).abs().max().item() < 0.05 * lr, key


# ------------------------------------------------------------------------------------------ greedy decoding


def until_eos(row, eos_id):
    row = list(row)
    return row[: row.index(eos_id) + 1] if eos_id in row else row


@pytest.mark.rounding
def test_greedy_decoding_gives_the_same_tokens():
    name = "post_bias_learned_unshared"
    from transformer_jax import decoding

    cfg, model, params, _ = build(name)
    # A random model repeats one token; large learned position tables make each step's argmax differ, so
    # that a cache or position slip would show.
    params = dict(params)
    for stack in ("encoder", "decoder"):
        table = params[stack]["positions"]["position_embedding"]
        params[stack] = dict(params[stack], positions={"position_embedding": 30.0 * table})
    max_length = 12
    jax_tokens, _ = decoding.greedy_decode(model, params, SRC, max_decode_len=max_length)  # cached, jitted
    jax_tokens = np.asarray(jax_tokens)
    reference = interop.TorchTransformer(cfg).eval()
    reference.load_state_dict(interop.flax_to_torch_state_dict(params, cfg))
    torch_tokens = interop.torch_greedy_decode(reference, torch.as_tensor(SRC), max_length).numpy()
    print(f"[parity] {name} greedy tokens: {jax_tokens.tolist()}")
    assert len({tuple(row) for row in jax_tokens}) > 1 and len(set(jax_tokens[0])) > 3  # not one repeated token
    for ours, theirs in zip(jax_tokens, torch_tokens):
        assert until_eos(ours, cfg.eos_id) == until_eos(theirs, cfg.eos_id)
