"""Attention maps come out of the model with the right shapes and rows summing to one; PNGs are written."""

import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import tiny
from transformer_jax.layers.embedding import sinusoidal_table
from transformer_jax.model import Transformer
from transformer_jax.visualize import attention_maps, plot_attention, plot_positional_encoding

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "results"))
import plot_curves  # noqa: E402


def test_attention_maps_and_pngs(tmp_path):
    cfg = tiny()
    model = Transformer(cfg)
    src = jnp.array([[5, 6, 7, 2, 0]])
    tgt = jnp.array([[1, 8, 9]])
    params = nn.unbox(model.init(jax.random.key(0), src, tgt)["params"])
    maps = attention_maps(model, params, src, tgt)
    assert set(maps) == {f"encoder/layer_{i}/self_attention" for i in range(2)} | {
        f"decoder/layer_{i}/{kind}" for i in range(2) for kind in ("self_attention", "cross_attention")
    }
    cross = maps["decoder/layer_0/cross_attention"]
    assert cross.shape == (1, cfg.num_heads, 3, 5)
    np.testing.assert_allclose(cross.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(cross[..., 4], 0.0)  # the padded source position gets no attention
    self_map = maps["decoder/layer_1/self_attention"][0, 0]
    np.testing.assert_array_equal(np.triu(self_map, 1), 0.0)  # causal
    png = plot_attention(cross[0], ["<s>", "a", "b"], ["x", "y", "z", "</s>", "<pad>"], tmp_path / "cross.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png = plot_positional_encoding(sinusoidal_table(64, 32), tmp_path / "pe.png")
    assert png.stat().st_size > 1000


def test_the_curves_script_plots_each_runs_validations_against_minutes_from_its_log(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 10, "elapsed_s": 30.0, "loss": 4.0}\n'
        '{"kind": "eval", "step": 10, "elapsed_s": 60.0, "perplexity": 50.0}\n'
        '{"kind": "bleu", "step": 10, "elapsed_s": 90.0, "bleu": 12.5}\n'
        '{"kind": "eval", "step": 20, "elapsed_s": 120.0, "perplexity": 30.0}\n'
        '{"kind": "bleu", "step": 20, "elapsed_s": 15'  # cut by a kill
    )
    assert plot_curves.curves(tmp_path) == {"bleu": [(1.5, 12.5)], "perplexity": [(1.0, 50.0), (2.0, 30.0)]}
    png = plot_curves.main([f"{tmp_path}:run", "--out", str(tmp_path / "curves.png")])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
