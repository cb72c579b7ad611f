"""Translating text with a trained model: length-batched, order-preserving, greedy or beam search.

translator = Translator.from_workdir("runs/tiny", checkpoint="averaged")
translator.translate(["three small red cats"])      # -> ["drei kleine rote Katzen"]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from transformer_jax.config import ModelConfig
from transformer_jax.decoding import DecodeConfig, beam_search, greedy_decode
from transformer_jax.errors import UserError
from transformer_jax.model import Transformer
from transformer_jax.workdir import load_model_for_inference

logger = logging.getLogger(__name__)

METHODS = ("beam", "greedy")
TOO_LONG_POLICIES = ("truncate", "error")
WIDTH_MULTIPLE = 16  # source widths are rounded up to this, so jit compiles a handful of shapes


class Hypothesis(NamedTuple):
    """A translation and its score (beam: length-normalised log-probability; greedy: log-probability)."""

    text: str
    score: float


class InputTooLongError(UserError, ValueError):
    """A source sentence has more tokens than the model's position table allows (line_number: 1-based)."""

    def __init__(self, message: str, line_number: int):
        super().__init__(message)
        self.line_number = line_number


class Translator:
    """Translates lines with a (model config, params, tokenizer) triple; outputs come back in input order."""

    def __init__(
        self,
        model_config: ModelConfig,
        params,
        tokenizer,
        *,
        decode_config: DecodeConfig | None = None,
        method: str = "beam",
        batch_size: int = 32,
        max_tokens: int | None = None,
        on_too_long: str = "truncate",
    ):
        """batch_size: sentences decoded together; max_tokens (instead): padded source tokens per batch."""
        if method not in METHODS:
            raise ValueError(f"method={method!r} is unknown; use one of {METHODS}.")
        if on_too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"on_too_long={on_too_long!r} is unknown; use one of {TOO_LONG_POLICIES}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
        self.model_config = model_config
        self.model = Transformer(model_config.replace(dropout_rate=0.0))
        self.params = params
        self.tokenizer = tokenizer
        self.decode_config = decode_config or DecodeConfig()
        self.method, self.batch_size, self.max_tokens, self.on_too_long = method, batch_size, max_tokens, on_too_long

    @classmethod
    def from_workdir(cls, workdir: str | Path, checkpoint: str | int | None = None, **options) -> Translator:
        """checkpoint: None (latest), a step, 'averaged' (written by `transformer-jax average`)."""
        model_config, params, tokenizer = load_model_for_inference(workdir, checkpoint)
        return cls(model_config, params, tokenizer, **options)

    def encode_source(self, line: str, line_number: int) -> list[int]:
        """Pieces + EOS, at most max_len tokens; longer input is truncated with a warning or refused."""
        ids = self.tokenizer.encode(line) + [self.model_config.eos_id]
        limit = self.model_config.max_len
        if len(ids) > limit:
            message = f"input line {line_number} has {len(ids)} tokens, more than the model's max_len={limit}"
            if self.on_too_long == "error":
                raise InputTooLongError(
                    message + "; shorten it, or allow truncation (--on-too-long truncate).", line_number
                )
            logger.warning("%s; truncated to %d tokens.", message, limit)
            ids = ids[: limit - 1] + [self.model_config.eos_id]
        return ids

    def translate(self, lines: Sequence[str], *, progress: bool = False) -> list[str]:
        """Translations of `lines`, in order; an empty (or blank) line gives an empty line."""
        return [hypotheses[0].text for hypotheses in self.translate_nbest(lines, progress=progress)]

    def translate_nbest(
        self, lines: Sequence[str], *, nbest: int = 1, progress: bool = False, first_line: int = 1
    ) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses of each line, best first, with scores (beam: log P / lp(|Y|), §6.1;
        greedy: log P, one hypothesis). A blank line gives one empty hypothesis with score 0. Messages number
        the lines from `first_line`."""
        limit = 1 if self.method == "greedy" else self.decode_config.beam_size
        if not 1 <= nbest <= limit:
            why = "greedy decoding keeps one hypothesis" if self.method == "greedy" else "the beam size"
            raise ValueError(f"nbest={nbest} must lie in [1, {limit}] ({why}); raise --beam-size for more.")
        sources = {
            index: self.encode_source(line, number)  # line index -> ids, blank lines left out
            for index, (number, line) in enumerate(enumerate(lines, start=first_line))
            if line.strip()
        }
        outputs = [[Hypothesis("", 0.0)] for _ in lines]
        order = sorted(sources, key=lambda index: len(sources[index]))
        bar = tqdm(total=len(order), unit="sent", disable=not progress, desc=f"{self.method} decode", leave=False)
        for batch_indices in self._batches(order, sources):
            decoded = self._decode_batch([sources[i] for i in batch_indices], nbest)
            for index, hypotheses in zip(batch_indices, decoded):
                outputs[index] = hypotheses
            bar.update(len(batch_indices))
        bar.close()
        return outputs

    def translate_stream(
        self, lines: Iterable[str], *, chunk_lines: int = 1000, nbest: int = 1, progress: bool = False
    ) -> Iterator[tuple[str, list[Hypothesis]]]:
        """(source line, n-best hypotheses) chunk by chunk (length-batched within each chunk), in input order."""

        def translated(chunk: list[str], first: int):
            try:
                results = self.translate_nbest(chunk, nbest=nbest, progress=progress, first_line=first)
            except InputTooLongError as error:  # refused line: the lines before it still come out, then the error
                before = chunk[: error.line_number - first]
                yield from zip(before, self.translate_nbest(before, nbest=nbest, progress=progress, first_line=first))
                raise
            yield from zip(chunk, results)

        chunk: list[str] = []
        first = 1
        try:
            for line in lines:
                chunk.append(line.rstrip("\n"))
                if len(chunk) == chunk_lines:
                    yield from translated(chunk, first)
                    first, chunk = first + len(chunk), []
        except UnicodeDecodeError:  # bytes that are not UTF-8: the lines read before them still come out
            yield from translated(chunk, first)
            raise
        if chunk:
            yield from translated(chunk, first)

    def _width(self, length: int) -> int:
        return min(self.model_config.max_len, -(-length // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)

    def _rows(self, width: int) -> int:
        """Sentences per batch at this padded width: batch_size, or as many as max_tokens allows."""
        return self.batch_size if self.max_tokens is None else max(1, self.max_tokens // width)

    def _batches(self, order: list[int], sources: dict[int, list[int]]) -> Iterator[list[int]]:
        """Consecutive runs of the length-sorted `order`, each within the row count of its longest sentence."""
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and end - start < self._rows(self._width(len(sources[order[end]]))):
                end += 1
            yield order[start:end]
            start = end

    def _decode_batch(self, sources: list[list[int]], nbest: int) -> list[list[Hypothesis]]:
        cfg = self.model_config
        width = self._width(max(map(len, sources)))
        inputs = np.full((self._rows(width), width), cfg.pad_id, np.int32)  # [rows, width]
        inputs[:, 0] = cfg.eos_id  # filler rows: an empty sentence
        for row, ids in enumerate(sources):
            inputs[row, : len(ids)] = ids
        if self.method == "greedy":
            tokens, _, log_probs = greedy_decode(
                self.model, self.params, inputs, config=self.decode_config, return_log_probs=True
            )
            sequences, scores = np.asarray(tokens)[:, None], np.asarray(log_probs)[:, None]  # [rows, 1, ...]
        else:
            sequences, scores = beam_search(self.model, self.params, inputs, config=self.decode_config, nbest=nbest)
            sequences, scores = np.asarray(sequences), np.asarray(scores)  # [rows, nbest, length], [rows, nbest]
        return [
            [
                Hypothesis(self.tokenizer.decode(sequences[row, rank].tolist()), float(scores[row, rank]))
                for rank in range(nbest)
            ]
            for row in range(len(sources))
        ]
