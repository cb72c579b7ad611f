"""Pictures people would rather look at than read: attention maps, positional encodings and runs' validation
curves against wall-clock minutes, as PNG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the file-only backend)
import numpy as np  # noqa: E402

from transformer_jax.model import Transformer  # noqa: E402


def attention_maps(model: Transformer, params, inputs, decoder_inputs) -> dict[str, np.ndarray]:
    """Every attention module's weights for one teacher-forced pass.

    Returns {'encoder/layer_0/self_attention': [batch, heads, q_len, kv_len], ...}.
    """
    _, state = model.apply({"params": params}, inputs, decoder_inputs, mutable=["intermediates"])
    maps = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["intermediates"]):
        names = [entry.key for entry in path if hasattr(entry, "key")]
        module = "/".join(name for name in names if name != "attention_weights")
        maps[module] = np.asarray(leaf)
    return maps


def plot_attention(
    weights: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str], path: str | Path, title: str = ""
) -> Path:
    """One heatmap per head: weights [heads, q_len, kv_len] (or [q_len, kv_len]); rows are queries."""
    weights = np.asarray(weights)
    weights = weights[None] if weights.ndim == 2 else weights
    heads = weights.shape[0]
    columns = min(heads, 4)
    rows = -(-heads // columns)
    cell = 0.35
    figure, axes = plt.subplots(
        rows,
        columns,
        squeeze=False,
        figsize=(max(3.0, columns * (1.5 + cell * len(key_labels))), max(2.5, rows * (1.0 + cell * len(query_labels)))),
    )
    for head, axis in enumerate(axes.flat):
        if head >= heads:
            axis.axis("off")
            continue
        axis.imshow(weights[head], vmin=0.0, vmax=1.0, cmap="viridis")
        axis.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=7)
        axis.set_yticks(range(len(query_labels)), query_labels, fontsize=7)
        axis.set_title(f"head {head}", fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_positional_encoding(table: np.ndarray, path: str | Path) -> Path:
    """Heatmap of a [max_len, d_model] position table (§3.5): columns are dimensions, rows positions."""
    figure, axis = plt.subplots(figsize=(8, 4))
    image = axis.imshow(table, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    axis.set_xlabel("dimension")
    axis.set_ylabel("position")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_validation_against_minutes(
    runs: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], path: str | Path
) -> Path:
    """Validation BLEU and perplexity (log scale) against wall-clock minutes, a line per run, from
    {label: {"bleu": [(minutes, greedy BLEU)], "perplexity": [(minutes, perplexity)]}}."""
    figure, (bleu_axis, ppl_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for label, curves in runs.items():
        for axis, key in ((bleu_axis, "bleu"), (ppl_axis, "perplexity")):
            if curves[key]:
                minutes, values = zip(*curves[key])
                axis.plot(minutes, values, marker="o", label=label)
    bleu_axis.set(xlabel="wall-clock minutes", ylabel="validation BLEU (greedy, 13a, cased)", title="BLEU")
    ppl_axis.set(xlabel="wall-clock minutes", ylabel="validation perplexity", yscale="log", title="perplexity")
    for axis in (bleu_axis, ppl_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
