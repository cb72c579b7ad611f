"""The encoder-decoder of Vaswani et al. 2017 (§3.1, Figure 1): layers, stacks and the Transformer.

Parameter names are stable: they are checkpoint keys and the map to PyTorch (interop/torch.py).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.config import ModelConfig
from transformer_jax.layers.attention import MultiHeadAttention
from transformer_jax.layers.embedding import PositionalEncoding, TokenEmbedding
from transformer_jax.layers.feedforward import FeedForward
from transformer_jax.layers.init import bias_init, kernel_init
from transformer_jax.layers.kv_cache import Lineage
from transformer_jax.layers.masks import causal_mask, combine_masks, padding_mask, real_mask, segment_mask


def layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
    """LayerNorm whose statistics are computed in float32 whatever the activation dtype."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_epsilon,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name=name,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=bias_init(("embed",)),
    )


def residual(cfg: ModelConfig, name: str, sublayer: Callable, x: jnp.ndarray, deterministic: bool):
    """§3.1 post-LN: LayerNorm(x + Dropout(Sublayer(x))); pre-LN: x + Dropout(Sublayer(LayerNorm(x)))."""
    norm = layer_norm(cfg, f"{name}_norm")
    dropout = nn.Dropout(rate=cfg.dropout_rate)
    if cfg.norm_position == "pre":
        return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
    """Self-attention then the position-wise FFN, each in a residual block (§3.1)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, mask=None, deterministic: bool = True):
        cfg = self.config
        self_attention = MultiHeadAttention(cfg, name="self_attention")
        x = residual(
            cfg, "self_attention", lambda y: self_attention(y, mask=mask, deterministic=deterministic), x, deterministic
        )
        ffn = FeedForward(cfg, name="ffn")
        return residual(cfg, "ffn", lambda y: ffn(y, deterministic=deterministic), x, deterministic)


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, then the FFN (§3.1)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        x,
        memory,
        self_mask=None,
        cross_mask=None,
        deterministic: bool = True,
        decode: bool = False,
        cache_block: int = 1,
    ):
        cfg = self.config
        self_attention = MultiHeadAttention(cfg, name="self_attention")
        x = residual(
            cfg,
            "self_attention",
            lambda y: self_attention(
                y, mask=self_mask, deterministic=deterministic, decode=decode, cache_block=cache_block
            ),
            x,
            deterministic,
        )
        cross_attention = MultiHeadAttention(cfg, name="cross_attention")
        x = residual(
            cfg,
            "cross_attention",
            lambda y: cross_attention(y, memory, mask=cross_mask, deterministic=deterministic, decode=decode),
            x,
            deterministic,
        )
        ffn = FeedForward(cfg, name="ffn")
        return residual(cfg, "ffn", lambda y: ffn(y, deterministic=deterministic), x, deterministic)


def embed_with_positions(cfg: ModelConfig, embedding: nn.Module, tokens, positions, deterministic: bool):
    """Dropout(token embedding * sqrt(d_model) + position encoding) (§3.4, §3.5, §5.4).

    positions: [batch, length], or None for rows that all start at 0 (unpacked): then one row's encodings,
    [1, length, d_model], broadcast over the batch. (Looked up for the whole batch, XLA folded the fixed sinusoids
    into a [batch, length, d_model] constant of the program: 71 MB for base's 1088 x 32 bucket, 2-4 s a compile.)
    """
    positions = default_positions(tokens[:1]) if positions is None else positions  # [1 or batch, length]
    x = embedding(tokens) + PositionalEncoding(cfg, name="positions")(positions)  # [batch, length, d_model]
    return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


def default_positions(tokens: jnp.ndarray) -> jnp.ndarray:
    """[batch, length] positions 0..length-1 for unpacked rows."""
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


class Encoder(nn.Module):
    """Embedding, positions and a stack of N encoder layers (plus a final LayerNorm in pre-LN mode)."""

    config: ModelConfig
    embedding: nn.Module

    @nn.compact
    def __call__(self, x, mask=None, positions=None, deterministic: bool = True):
        """x: [batch, src_len] token ids; mask: [batch, 1, src_len, src_len] -> [batch, src_len, d_model]."""
        cfg = self.config
        x = embed_with_positions(cfg, self.embedding, x, positions, deterministic)
        for index in range(cfg.num_encoder_layers):
            x = EncoderLayer(cfg, name=f"layer_{index}")(x, mask, deterministic)
        if cfg.norm_position == "pre":
            x = layer_norm(cfg, "final_norm")(x)
        return x


class Decoder(nn.Module):
    """Embedding, positions and a stack of N decoder layers (plus a final LayerNorm in pre-LN mode).

    With `decode=True` it takes one token per call ([batch, 1]) and keeps in the cache a Lineage (the position, and
    which cached keys each row reads) for all its layers; `cache_block` consecutive rows share one group of
    self-attention keys (MultiHeadAttention).
    """

    config: ModelConfig
    embedding: nn.Module

    @nn.compact
    def __call__(
        self,
        y,
        memory,
        self_mask=None,
        cross_mask=None,
        positions=None,
        deterministic: bool = True,
        decode: bool = False,
        cache_block: int = 1,
    ):
        """y: [batch, tgt_len] ids; memory: [batch, src_len, d_model] -> [batch, tgt_len, d_model]."""
        cfg = self.config
        if decode:
            positions, self_mask = self._decode_step(y, cache_block)
        y = embed_with_positions(cfg, self.embedding, y, positions, deterministic)
        for index in range(cfg.num_decoder_layers):
            layer = DecoderLayer(cfg, name=f"layer_{index}")
            y = layer(y, memory, self_mask, cross_mask, deterministic, decode, cache_block)
        if cfg.norm_position == "pre":
            y = layer_norm(cfg, "final_norm")(y)
        return y

    def _decode_step(self, y, cache_block: int):
        """Decode mode: this step's positions [batch, 1] and the self-attention mask over the cached key slots, from
        the one Lineage all layers share (layers/kv_cache.py). The call that makes the cache only sizes it."""
        if not self.has_variable("cache", "lineage"):
            self.put_variable("cache", "lineage", Lineage.empty(y.shape[0], y.shape[1], cache_block))
            return None, None
        lineage: nn.Variable[Lineage] = self.variable("cache", "lineage")
        positions = jnp.full(y.shape, lineage.value.index, dtype=jnp.int32)  # [batch, 1]
        lineage.value, mask = lineage.value.advance()
        return positions, mask


class Transformer(nn.Module):
    """Encoder-decoder with shared source/target/output embeddings (§3.4) when config.share_embeddings."""

    config: ModelConfig

    def setup(self):
        cfg = self.config
        if cfg.share_embeddings:
            self.embed = TokenEmbedding(cfg)
            source_embedding = target_embedding = self.embed
        else:
            self.source_embed = TokenEmbedding(cfg)
            self.target_embed = TokenEmbedding(cfg)
            self.output_projection = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=jnp.float32,
                param_dtype=cfg.param_dtype,
                kernel_init=kernel_init(("embed", "vocab")),
            )
            source_embedding, target_embedding = self.source_embed, self.target_embed
        self.encoder = Encoder(cfg, embedding=source_embedding)
        self.decoder = Decoder(cfg, embedding=target_embedding)
        if cfg.final_logits_bias:
            self.logits_bias = self.param(
                "final_logits_bias", bias_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype
            )  # [vocab]

    def _check_length(self, name: str, tokens) -> None:
        """Positions index a table of max_len rows (§3.5): a longer input would read past it."""
        if tokens.shape[-1] > self.config.max_len:
            raise ValueError(
                f"{name} has length {tokens.shape[-1]}, longer than ModelConfig.max_len={self.config.max_len} "
                f"(the position table); truncate or split the input, or use a model with a larger max_len."
            )

    def encode(self, inputs, inputs_positions=None, inputs_segmentation=None, deterministic: bool = True):
        """inputs: [batch, src_len] ids (pad_id = padding) -> [batch, src_len, d_model]."""
        cfg = self.config
        self._check_length("inputs", inputs)
        mask = combine_masks(
            padding_mask(inputs, inputs, cfg.pad_id),
            None if inputs_segmentation is None else segment_mask(inputs_segmentation, inputs_segmentation),
        )  # [batch, 1, src_len, src_len]
        return self.encoder(inputs, mask, inputs_positions, deterministic)

    def decode(
        self,
        encoded,
        inputs,
        decoder_inputs,
        targets_positions=None,
        inputs_segmentation=None,
        targets_segmentation=None,
        deterministic: bool = True,
        decode: bool = False,
        cache_block: int = 1,
    ):
        """Logits [batch, tgt_len, vocab] (float32) for decoder_inputs [batch, tgt_len] (the shifted targets).

        encoded: [batch, src_len, d_model] from `encode`; inputs: the source ids, for its padding mask.
        With decode=True, decoder_inputs is one step [batch, 1] and the 'cache' collection is mutable; the call
        that makes the cache (decoding/steps.init_cache) sets its layout: `cache_block` consecutive rows (the
        hypotheses of one source in beam search) keep their self-attention keys in one group.
        """
        cfg = self.config
        self._check_length("decoder_inputs", decoder_inputs)
        if decode:
            self_mask = None  # the cache masks the positions not yet written
            cross_mask = (inputs != cfg.pad_id)[:, None, None, :]  # [batch, 1, 1, src_len]
        else:
            target_real = self._target_real(decoder_inputs, targets_positions)  # [batch, tgt_len]
            self_mask = combine_masks(
                real_mask(target_real, target_real),
                causal_mask(decoder_inputs.shape[1]),
                None if targets_segmentation is None else segment_mask(targets_segmentation, targets_segmentation),
            )  # [batch, 1, tgt_len, tgt_len]
            cross_mask = combine_masks(
                real_mask(target_real, inputs != cfg.pad_id),
                None if targets_segmentation is None else segment_mask(targets_segmentation, inputs_segmentation),
            )  # [batch, 1, tgt_len, src_len]
        y = self.decoder(
            decoder_inputs, encoded, self_mask, cross_mask, targets_positions, deterministic, decode, cache_block
        )
        if cfg.share_embeddings:
            logits = self.embed.attend(y)
        else:
            logits = self.output_projection(y.astype(jnp.float32))  # [batch, tgt_len, vocab]
        if cfg.final_logits_bias:
            logits = logits + self.logits_bias.astype(jnp.float32)
        return logits

    def _target_real(self, decoder_inputs, targets_positions) -> jnp.ndarray:
        """[batch, tgt_len]: the decoder inputs that are tokens, not padding; where the decoder starts from pad
        (bos_id == pad_id, as Marian), the start token at each sequence's position 0 counts as a token."""
        cfg = self.config
        real = decoder_inputs != cfg.pad_id
        if cfg.bos_id == cfg.pad_id:
            positions = default_positions(decoder_inputs) if targets_positions is None else targets_positions
            real = real | (positions == 0)
        return real

    def __call__(
        self,
        inputs,
        decoder_inputs,
        inputs_positions=None,
        targets_positions=None,
        inputs_segmentation=None,
        targets_segmentation=None,
        deterministic: bool = True,
    ):
        """Teacher-forced logits [batch, tgt_len, vocab] of inputs [batch, src_len], decoder_inputs [batch, tgt_len]."""
        encoded = self.encode(inputs, inputs_positions, inputs_segmentation, deterministic)
        return self.decode(
            encoded, inputs, decoder_inputs, targets_positions, inputs_segmentation, targets_segmentation, deterministic
        )
