"""Translating text with a trained model: length-batched, order-preserving, greedy or beam search.

    translator = Translator.from_workdir("runs/tiny", checkpoint="averaged")
    translator.translate(["three small red cats"])      # -> ["drei kleine rote Katzen"]
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from transformer_jax import checkpoint as ckpt
from transformer_jax.config import ModelConfig
from transformer_jax.decoding import DecodeConfig, beam_search, greedy_decode
from transformer_jax.model import Transformer

logger = logging.getLogger(__name__)

METHODS = ("beam", "greedy")
TOO_LONG_POLICIES = ("truncate", "error")
WIDTH_MULTIPLE = 16  # source widths are rounded up to this, so jit compiles a handful of shapes


class InputTooLongError(ValueError):
    """A source sentence has more tokens than the model's position table allows."""


class Translator:
    """Translates lines with a (model config, params, tokenizer) triple; outputs come back in input order."""

    def __init__(self, model_config: ModelConfig, params, tokenizer, *, decode_config: DecodeConfig | None = None,
                 method: str = "beam", batch_size: int = 32, on_too_long: str = "truncate"):
        if method not in METHODS:
            raise ValueError(f"method={method!r} is unknown; use one of {METHODS}.")
        if on_too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"on_too_long={on_too_long!r} is unknown; use one of {TOO_LONG_POLICIES}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        self.model_config = model_config
        self.model = Transformer(model_config.replace(dropout_rate=0.0))
        self.params = params
        self.tokenizer = tokenizer
        self.decode_config = decode_config or DecodeConfig()
        self.method, self.batch_size, self.on_too_long = method, batch_size, on_too_long

    @classmethod
    def from_workdir(cls, workdir: str | Path, checkpoint: str | int | None = None, **options) -> "Translator":
        """checkpoint: None (latest), a step, 'averaged' (written by `transformer-jax average`)."""
        model_config, params, tokenizer = ckpt.load_model_for_inference(workdir, checkpoint)
        return cls(model_config, params, tokenizer, **options)

    def encode_source(self, line: str, line_number: int) -> list[int]:
        """Pieces + EOS, at most max_len tokens; longer input is truncated with a warning or refused."""
        ids = self.tokenizer.encode(line) + [self.model_config.eos_id]
        limit = self.model_config.max_len
        if len(ids) > limit:
            message = (f"input line {line_number} has {len(ids)} tokens, more than the model's max_len={limit}")
            if self.on_too_long == "error":
                raise InputTooLongError(message + "; shorten it, or allow truncation (--on-too-long truncate).")
            logger.warning("%s; truncated to %d tokens.", message, limit)
            ids = ids[: limit - 1] + [self.model_config.eos_id]
        return ids

    def translate(self, lines: Sequence[str], *, progress: bool = False) -> list[str]:
        """Translations of `lines`, in order; an empty (or blank) line gives an empty line."""
        sources = [self.encode_source(line, number) if line.strip() else None
                   for number, line in enumerate(lines, start=1)]
        outputs = [""] * len(lines)
        order = sorted((i for i, ids in enumerate(sources) if ids is not None), key=lambda i: len(sources[i]))
        batches = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        bar = tqdm(total=len(order), unit="sent", disable=not progress, desc=f"{self.method} decode",
                   leave=False)
        for batch_indices in batches:
            for index, text in zip(batch_indices, self._decode_batch([sources[i] for i in batch_indices])):
                outputs[index] = text
            bar.update(len(batch_indices))
        bar.close()
        return outputs

    def translate_stream(self, lines: Iterable[str], *, chunk_lines: int = 1000, progress: bool = False
                         ) -> Iterator[str]:
        """Translates a stream chunk by chunk (length-batched within each chunk), yielding in input order."""
        chunk: list[str] = []
        for line in lines:
            chunk.append(line.rstrip("\n"))
            if len(chunk) == chunk_lines:
                yield from self.translate(chunk, progress=progress)
                chunk = []
        if chunk:
            yield from self.translate(chunk, progress=progress)

    def _decode_batch(self, sources: list[list[int]]) -> list[str]:
        cfg = self.model_config
        width = min(cfg.max_len, -(-max(map(len, sources)) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
        inputs = np.full((self.batch_size, width), cfg.pad_id, np.int32)  # [batch_size, width]
        inputs[:, 0] = cfg.eos_id  # filler rows: an empty sentence
        for row, ids in enumerate(sources):
            inputs[row, :len(ids)] = ids
        if self.method == "greedy":
            tokens, _ = greedy_decode(self.model, self.params, inputs, config=self.decode_config)
        else:
            sequences, _ = beam_search(self.model, self.params, inputs, config=self.decode_config)
            tokens = sequences[:, 0]  # the best of the n-best list
        tokens = np.asarray(tokens)
        return [self.tokenizer.decode(tokens[row].tolist()) for row in range(len(sources))]
