"""A PyTorch reference of the same Transformer (conversion of parameters: interop/torch.py).

`TorchTransformer(config)` is built on `torch.nn.TransformerEncoderLayer` / `TransformerDecoderLayer`
(`batch_first=True`, `norm_first` for pre-LN) with:

- the token embedding scaled by sqrt(d_model) (§3.4), sinusoidal positions in the same layout as
  `transformer_jax.layers.embedding.sinusoidal_table` (§3.5) or learned tables (one per stack, as in Flax),
  and the output projection tied to the embedding (§3.4) unless `share_embeddings=False`;
- custom encoder/decoder stacks: no extra final LayerNorm in post-LN mode (§3.1), a final LayerNorm in
  pre-LN mode (what `torch.nn.TransformerEncoder(norm=...)` would add);
- `attention_bias=False` (the paper's §3.2.2, our default): the layers are built with `bias=True` (the FFN
  and LayerNorm keep their biases, as in Flax) and their attention modules are *replaced* by
  `nn.MultiheadAttention(bias=False)`, so the state_dict has no attention biases at all (no frozen zeros).
  A side effect: torch's eval-mode encoder "fast path" is off for those layers (torch requires biases).
- dropout as in the config: `dropout_rate` on the residual branches and the embedding sums,
  `attention_dropout_rate` inside attention, `relu_dropout_rate` between the FFN matrices
  (torch's layers take a single rate; the sub-modules are set one by one). Use rates of 0 for parity.
- LayerNorm epsilon from `config.layer_norm_epsilon` (1e-6 by default; torch's own default is 1e-5).

Masks. Flax masks a padded *query* row entirely (its attention output is zero); torch only masks padded
keys. Outputs therefore agree at real (non-pad) positions only; pad positions never influence real ones.
A source row made only of padding gives NaN in torch (all keys masked) and zeros in Flax.
"""

from __future__ import annotations

import math

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError as error:  # pragma: no cover - exercised only where torch is absent
    raise ImportError(
        "transformer_jax.interop needs PyTorch, which is not installed. "
        "Install the extra with: pip install 'transformer-jax[torch]'"
    ) from error


from transformer_jax.config import ModelConfig
from transformer_jax.layers.embedding import sinusoidal_table

__all__ = ["TorchTransformer", "torch_greedy_decode"]


# ----------------------------------------------------------------------------------------------------------
# The reference model
# ----------------------------------------------------------------------------------------------------------


def _attention(cfg: ModelConfig, device=None) -> nn.MultiheadAttention:
    return nn.MultiheadAttention(
        cfg.d_model,
        cfg.num_heads,
        dropout=cfg.attention_dropout_rate,
        bias=cfg.attention_bias,
        batch_first=True,
        device=device,
    )


def _configure_layer(layer: nn.Module, cfg: ModelConfig, attention_names: tuple[str, ...], device=None):
    """Give a torch layer the config's three dropout rates and (if needed) bias-free attention."""
    for name in attention_names:
        if cfg.attention_bias:
            getattr(layer, name).dropout = cfg.attention_dropout_rate
        else:
            setattr(layer, name, _attention(cfg, device))
    layer.dropout = nn.Dropout(cfg.relu_dropout_rate)  # between linear1 and linear2
    return layer


class _Stack(nn.Module):
    """A stack of torch layers, its positions and (pre-LN only) a final LayerNorm."""

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module], device=None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.max_len = cfg.max_len
        if cfg.position_encoding == "learned":
            self.positions = nn.Embedding(cfg.max_len, cfg.d_model, device=device)
        else:
            table = torch.from_numpy(sinusoidal_table(cfg.max_len, cfg.d_model, cfg.sinusoid_layout))
            self.register_buffer("position_table", table.to(device), persistent=False)  # [max_len, d_model]
        self.norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon, device=device) if cfg.norm_position == "pre" else None
        )

    def position_encoding(self, length: int, offset: int = 0) -> torch.Tensor:
        """[length, d_model] encodings of positions offset..offset+length-1."""
        if offset + length > self.max_len:
            raise ValueError(
                f"positions up to {offset + length - 1} requested but ModelConfig.max_len="
                f"{self.max_len}; shorten the input or use a config with a larger max_len."
            )
        table = self.positions.weight if hasattr(self, "positions") else self.get_buffer("position_table")
        return table[offset : offset + length]


class TorchTransformer(nn.Module):
    """The same encoder-decoder as `transformer_jax.model.Transformer`, on `torch.nn` layers, float32.

    forward(inputs [batch, src_len], decoder_inputs [batch, tgt_len]) -> logits [batch, tgt_len, vocab].
    Weights come from `load_state_dict(flax_to_torch_state_dict(params, config))`.
    """

    def __init__(self, config: ModelConfig, device=None):
        super().__init__()
        cfg = self.config = config
        common = dict(
            d_model=cfg.d_model,
            nhead=cfg.num_heads,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout_rate,
            activation="relu",
            layer_norm_eps=cfg.layer_norm_epsilon,
            batch_first=True,
            norm_first=cfg.norm_position == "pre",
            bias=True,
            device=device,
        )
        if cfg.share_embeddings:
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, device=device)
        else:
            self.source_embed = nn.Embedding(cfg.vocab_size, cfg.d_model, device=device)
            self.target_embed = nn.Embedding(cfg.vocab_size, cfg.d_model, device=device)
            self.output_projection = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, device=device)
        encoder_layers = [
            _configure_layer(nn.TransformerEncoderLayer(**common), cfg, ("self_attn",), device)
            for _ in range(cfg.num_encoder_layers)
        ]
        decoder_layers = [
            _configure_layer(nn.TransformerDecoderLayer(**common), cfg, ("self_attn", "multihead_attn"), device)
            for _ in range(cfg.num_decoder_layers)
        ]
        self.encoder = _Stack(cfg, encoder_layers, device)
        self.decoder = _Stack(cfg, decoder_layers, device)
        self.embedding_dropout = nn.Dropout(cfg.dropout_rate)

    def _embed(self, table: nn.Embedding, stack: _Stack, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Dropout(embedding * sqrt(d_model) + position encoding): [batch, length] -> [batch, length, d_model]."""
        x = table(tokens) * math.sqrt(self.config.d_model)
        return self.embedding_dropout(x + stack.position_encoding(tokens.shape[1], offset)[None])

    @property
    def source_embedding(self) -> nn.Embedding:
        return self.embed if self.config.share_embeddings else self.source_embed

    @property
    def target_embedding(self) -> nn.Embedding:
        return self.embed if self.config.share_embeddings else self.target_embed

    def encode(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: [batch, src_len] ids -> [batch, src_len, d_model] (pad rows differ from Flax: see module doc)."""
        padding = inputs == self.config.pad_id  # [batch, src_len], True = ignore
        x = self._embed(self.source_embedding, self.encoder, inputs)
        for layer in self.encoder.layers:
            x = layer(x, src_key_padding_mask=padding)
        if self.encoder.norm is not None:
            x = self.encoder.norm(x)
        return x

    def decode(self, encoded: torch.Tensor, inputs: torch.Tensor, decoder_inputs: torch.Tensor) -> torch.Tensor:
        """Logits [batch, tgt_len, vocab] for decoder_inputs [batch, tgt_len], attending to encoded."""
        cfg = self.config
        length = decoder_inputs.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=decoder_inputs.device).triu(1)  # True = hide
        y = self._embed(self.target_embedding, self.decoder, decoder_inputs)
        for layer in self.decoder.layers:
            y = layer(
                y,
                encoded,
                tgt_mask=causal,
                tgt_key_padding_mask=decoder_inputs == cfg.pad_id,
                memory_key_padding_mask=inputs == cfg.pad_id,
            )
        if self.decoder.norm is not None:
            y = self.decoder.norm(y)
        if cfg.share_embeddings:
            return F.linear(y, self.embed.weight)
        return self.output_projection(y)

    def forward(self, inputs: torch.Tensor, decoder_inputs: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(inputs), inputs, decoder_inputs)


@torch.no_grad()
def torch_greedy_decode(
    model: TorchTransformer, inputs: torch.Tensor, max_length: int, stop_early: bool = True
) -> torch.Tensor:
    """Greedy decoding that recomputes the whole prefix at every step (no cache): the simple reference.

    Starts from bos_id and never picks pad_id (as `transformer_jax.decoding.greedy_decode`); returns
    [batch, max_length] tokens (bos excluded), pad_id after a row's eos_id. With stop_early, the loop ends
    once every row has emitted eos_id (stop_early=False always runs max_length steps, for benchmarks).
    """
    cfg = model.config
    encoded = model.encode(inputs)
    batch = inputs.shape[0]
    tokens = torch.full((batch, max_length + 1), cfg.pad_id, dtype=torch.long, device=inputs.device)
    tokens[:, 0] = cfg.bos_id
    finished = torch.zeros(batch, dtype=torch.bool, device=inputs.device)
    for index in range(max_length):
        logits = model.decode(encoded, inputs, tokens[:, : index + 1])[:, -1]  # [batch, vocab]
        logits[:, cfg.pad_id] = -math.inf
        token = torch.where(finished, cfg.pad_id, logits.argmax(-1))
        tokens[:, index + 1] = token
        finished |= token == cfg.eos_id
        if stop_early and bool(finished.all()):
            break
    return tokens[:, 1:]
