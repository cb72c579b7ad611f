"""Several Transformers decoded as one (fairseq's `--path a.pt:b.pt`): at every step, the mean of the members'
next-token probabilities, log(1/M sum_m p_m(y | x, y_<t)), computed in log space; a proper distribution, so each
search (greedy, beam, sampling, reference scoring) runs on it unchanged.

    ensemble = Ensemble((config_a, config_b))
    params = ensemble_params([params_a, params_b])
    tokens, lengths = greedy_decode(ensemble, params, inputs)

The members share the vocabulary and the special ids; each keeps its own encoder output and decode cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config import ModelConfig
from transformer_jax.decoding.steps import as_params
from transformer_jax.model import Transformer

SHARED_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")


class Ensemble(nn.Module):
    """The members' Transformers with a Transformer's encode / decode / __call__; `config` is what the searches read
    (the shared ids, and the shortest position table)."""

    members: tuple[ModelConfig, ...]

    @property
    def config(self) -> ModelConfig:
        return self.members[0].replace(max_len=min(member.max_len for member in self.members))

    def setup(self):
        if not self.members:
            raise ValueError("an ensemble needs at least one model.")
        for index, member in enumerate(self.members[1:], start=1):
            different = [f for f in SHARED_FIELDS if getattr(member, f) != getattr(self.members[0], f)]
            if different:
                raise ValueError(
                    f"model {index} of the ensemble differs from model 0 in {', '.join(different)}: an ensemble's "
                    "models share one vocabulary and its special ids."
                )
        self.models = [Transformer(member) for member in self.members]

    def encode(self, inputs):
        """A tuple: each member's encoder output [batch, src_len, d_model]."""
        return tuple(model.encode(inputs) for model in self.models)

    def decode(self, encoded, inputs, decoder_inputs, deterministic: bool = True, decode: bool = False, cache_block=1):
        """log of the members' mean next-token probability [batch, tgt_len, vocab] (float32), as the logits."""
        log_probs = jnp.stack(
            [
                jax.nn.log_softmax(
                    model.decode(
                        memory,
                        inputs,
                        decoder_inputs,
                        deterministic=deterministic,
                        decode=decode,
                        cache_block=cache_block,
                    ).astype(jnp.float32),
                    axis=-1,
                )
                for model, memory in zip(self.models, encoded)
            ]
        )  # [members, batch, tgt_len, vocab]
        return jax.nn.logsumexp(log_probs, axis=0) - math.log(len(self.models))

    def __call__(self, inputs, decoder_inputs):
        return self.decode(self.encode(inputs), inputs, decoder_inputs)


def ensemble_params(members: Sequence) -> dict:
    """The parameters of an Ensemble from its members' parameters (each plain or {'params': ...}), in order."""
    return {f"models_{index}": as_params(params) for index, params in enumerate(members)}
