"""Translating text with a trained model: length-batched, order-preserving; beam search, greedy or sampling, each
optionally continuing a given target prefix, each batch split over the process's devices; and scoring given
translations.

translator = Translator.from_workdir("runs/tiny", checkpoint="averaged")
translator.translate(["three small red cats"])      # -> ["drei kleine rote Katzen"]
translator.score(["three small red cats"], ["drei kleine rote Katzen"])   # -> [ReferenceScore(log_prob, tokens)]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from tqdm import tqdm

from transformer_jax import sharding
from transformer_jax.config import ModelConfig
from transformer_jax.decoding import (
    DecodeConfig,
    Ensemble,
    beam_search,
    ensemble_params,
    greedy_decode,
    sample,
    token_log_probs,
)
from transformer_jax.errors import UserError
from transformer_jax.model import Transformer
from transformer_jax.workdir import load_model_for_inference

logger = logging.getLogger(__name__)

METHODS = ("beam", "greedy", "sample")
TOO_LONG_POLICIES = ("truncate", "error")
WIDTH_MULTIPLE = 16  # source widths are rounded up to this, so jit compiles a handful of shapes


class Hypothesis(NamedTuple):
    """A translation and its score (beam: length-normalised log-probability; greedy, sample: log-probability)."""

    text: str
    score: float


class ReferenceScore(NamedTuple):
    """A given translation's log P(target | source) and its tokens' log-probabilities (target pieces, then EOS)."""

    log_prob: float
    tokens: list[float]


class InputTooLongError(UserError, ValueError):
    """A source sentence has more tokens than the model's position table allows (line_number: 1-based)."""

    def __init__(self, message: str, line_number: int):
        super().__init__(message)
        self.line_number = line_number


class Translator:
    """Translates lines with a (model config, params, tokenizer) triple; outputs come back in input order. With a
    tuple of model configs and a list of their params, the models decode as one ensemble (decoding.Ensemble)."""

    def __init__(
        self,
        model_config: ModelConfig | tuple[ModelConfig, ...],
        params,
        tokenizer,
        *,
        decode_config: DecodeConfig | None = None,
        method: str = "beam",
        batch_size: int = 32,
        max_tokens: int | None = None,
        on_too_long: str = "truncate",
        devices: Sequence[jax.Device] | None = None,
    ):
        """batch_size: sentences decoded together; max_tokens (instead): padded source tokens per batch. devices:
        each batch is split over these along a data axis (its rows rounded up to a multiple of their number), the
        parameters replicated on each; default one device."""
        if method not in METHODS:
            raise ValueError(f"method={method!r} is unknown; use one of {METHODS}.")
        if on_too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"on_too_long={on_too_long!r} is unknown; use one of {TOO_LONG_POLICIES}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
        self.model: Transformer | Ensemble
        if isinstance(model_config, tuple):
            self.model = Ensemble(tuple(member.replace(dropout_rate=0.0) for member in model_config))
            self.params = ensemble_params(params)
        else:
            self.model = Transformer(model_config.replace(dropout_rate=0.0))
            self.params = params
        self.model_config = self.model.config
        self.mesh = None if devices is None or len(devices) < 2 else sharding.make_mesh({"data": -1}, devices)
        if self.mesh is not None:
            self.params = jax.device_put(
                self.params, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
            )
        self.tokenizer = tokenizer
        self.decode_config = decode_config or DecodeConfig()
        self.method, self.batch_size, self.max_tokens, self.on_too_long = method, batch_size, max_tokens, on_too_long

    @classmethod
    def from_workdir(
        cls, workdir: str | Path, checkpoint: str | int | None = None, *, ensemble: Sequence[str | Path] = (), **options
    ) -> Translator:
        """checkpoint: None (latest), a step, 'averaged' (written by `transformer-jax average`). ensemble: more
        workdirs (the same checkpoint name of each, the same tokenizer) decoded together with this one."""
        model_config, params, tokenizer = load_model_for_inference(workdir, checkpoint)
        if not ensemble:
            return cls(model_config, params, tokenizer, **options)
        configs, all_params = [model_config], [params]
        for other in ensemble:
            other_config, other_params, other_tokenizer = load_model_for_inference(other, checkpoint)
            if other_tokenizer.fingerprint != tokenizer.fingerprint:
                raise UserError(
                    f"{other} has another tokenizer than {workdir}: an ensemble's models must share one vocabulary "
                    "(train them on the same data with the same data.vocab_size and seed, or copy one tokenizer)."
                )
            configs.append(other_config)
            all_params.append(other_params)
        return cls(tuple(configs), all_params, tokenizer, **options)

    def _limits(self) -> int:
        """Hypotheses a line can have: 1 (greedy), the beam size, or the samples drawn."""
        return {"greedy": 1, "beam": self.decode_config.beam_size, "sample": self.decode_config.num_samples}[
            self.method
        ]

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
        self,
        lines: Sequence[str],
        *,
        nbest: int = 1,
        progress: bool = False,
        numbers: Sequence[int] | None = None,
        prefixes: Sequence[str] | None = None,
    ) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses of each line, best first, with scores (beam: log P / lp(|Y|), §6.1;
        greedy: log P, one hypothesis; sample: the first `nbest` samples, in the order drawn, log P). A blank
        line gives one empty hypothesis with score 0. prefixes: per line, the target text every hypothesis starts
        with ('' for none). numbers: the lines' 1-based numbers in their file (default 1, 2, ...), for messages
        and as sampling's sentence ids."""
        limit = self._limits()
        if not 1 <= nbest <= limit:
            why = {"greedy": "greedy decoding keeps one hypothesis", "beam": "the beam size; raise --beam-size"}
            raise ValueError(
                f"nbest={nbest} must lie in [1, {limit}] ({why.get(self.method, 'the samples; raise --num-samples')})."
            )
        numbers = list(range(1, len(lines) + 1)) if numbers is None else list(numbers)
        for given, what in ((prefixes, "prefixes"), (numbers, "line numbers")):
            if given is not None and len(given) != len(lines):
                raise ValueError(f"{len(given)} {what} for {len(lines)} lines: give one per line.")
        sources = {
            index: self.encode_source(line, number)  # line index -> ids, blank lines left out
            for index, (number, line) in enumerate(zip(numbers, lines))
            if line.strip()
        }
        outputs = [[Hypothesis("", 0.0)] for _ in lines]
        order = sorted(sources, key=lambda index: len(sources[index]))
        bar = tqdm(total=len(order), unit="sent", disable=not progress, desc=f"{self.method} decode", leave=False)
        for batch_indices in self._batches(order, sources):
            forced = [self.tokenizer.encode_target(prefixes[i]) if prefixes else [] for i in batch_indices]
            ids = [numbers[i] - 1 for i in batch_indices]  # 0-based line numbers
            decoded = self._decode_batch([sources[i] for i in batch_indices], nbest, ids, forced)
            for index, hypotheses in zip(batch_indices, decoded):
                outputs[index] = hypotheses
            bar.update(len(batch_indices))
        bar.close()
        return outputs

    def translate_stream(
        self,
        lines: Iterable[str],
        *,
        chunk_lines: int = 1000,
        nbest: int = 1,
        progress: bool = False,
        prefixes: Iterable[str] | None = None,
        shard: tuple[int, int] = (0, 1),
        skip: int = 0,
    ) -> Iterator[tuple[int, str, list[Hypothesis]]]:
        """(line number, source line, n-best hypotheses) chunk by chunk (length-batched within each chunk), in input
        order, reading `lines` as they come (a file of any size). prefixes: per line, the target text its
        hypotheses start with. shard=(k, n): only the lines whose 0-based number is k modulo n (process k of n
        translating one file); skip: leave out this shard's first `skip` lines (done before a restart). A line's
        output depends on its number, not on the shard or the chunk."""
        k, n = shard
        if not 0 <= k < n:
            raise ValueError(f"shard {k}/{n}: the shard index must lie in [0, {n}).")
        prefix_lines = iter(prefixes) if prefixes is not None else None

        def numbered() -> Iterator[tuple[int, str, str]]:
            kept = 0
            for number, line in enumerate(lines, start=1):
                prefix = "" if prefix_lines is None else _next_prefix(prefix_lines, number)
                if (number - 1) % n == k:
                    kept += 1
                    if kept > skip:
                        yield number, line.rstrip("\n"), prefix

        def translated(chunk: list[tuple[int, str, str]]):
            numbers, texts, given = (list(column) for column in zip(*chunk))
            forced = given if prefix_lines is not None else None
            try:
                results = self.translate_nbest(texts, nbest=nbest, progress=progress, numbers=numbers, prefixes=forced)
            except InputTooLongError as error:  # refused line: the lines before it still come out, then the error
                before = chunk[: numbers.index(error.line_number)]
                if before:
                    yield from translated(before)
                raise
            yield from zip(numbers, texts, results)

        chunk: list[tuple[int, str, str]] = []
        try:
            for item in numbered():
                chunk.append(item)
                if len(chunk) == chunk_lines:
                    yield from translated(chunk)
                    chunk = []
        except UnicodeDecodeError:  # bytes that are not UTF-8: the lines read before them still come out
            if chunk:
                yield from translated(chunk)
            raise
        if chunk:
            yield from translated(chunk)

    def _width(self, length: int) -> int:
        return min(self.model_config.max_len, -(-length // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)

    def _rows(self, width: int) -> int:
        """Sentences per batch at this padded width: batch_size, or as many as max_tokens allows; a multiple of the
        devices."""
        rows = self.batch_size if self.max_tokens is None else max(1, self.max_tokens // width)
        split = 1 if self.mesh is None else self.mesh.size
        return -(-rows // split) * split

    def _batches(self, order: list[int], sources: dict[int, list[int]]) -> Iterator[list[int]]:
        """Consecutive runs of the length-sorted `order`, each within the row count of its longest sentence."""
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and end - start < self._rows(self._width(len(sources[order[end]]))):
                end += 1
            yield order[start:end]
            start = end

    def _inputs(self, sources: list[list[int]]) -> np.ndarray:
        """[rows, width] padded ids of `sources`; the filler rows beyond them are empty sentences (EOS)."""
        cfg = self.model_config
        width = self._width(max(map(len, sources)))
        inputs = np.full((self._rows(width), width), cfg.pad_id, np.int32)  # [rows, width]
        inputs[:, 0] = cfg.eos_id
        for row, ids in enumerate(sources):
            inputs[row, : len(ids)] = ids
        return inputs

    def _decode_batch(
        self, sources: list[list[int]], nbest: int, line_ids: list[int], prefixes: list[list[int]]
    ) -> list[list[Hypothesis]]:
        inputs = self._inputs(sources)
        model, params, config = self.model, self.params, self.decode_config
        mesh = self.mesh
        rules = sharding.DEFAULT_RULES if mesh is None else sharding.rules_for_mesh(mesh)
        if self.method == "greedy":
            tokens, _, log_probs = greedy_decode(
                model, params, inputs, config=config, prefixes=prefixes, return_log_probs=True, mesh=mesh, rules=rules
            )
            sequences, scores = np.asarray(tokens)[:, None], np.asarray(log_probs)[:, None]  # [rows, 1, ...]
        elif self.method == "sample":
            ids = np.zeros((inputs.shape[0],), np.int32)  # [rows]; filler rows' draws are thrown away
            ids[: len(line_ids)] = line_ids
            tokens, _, log_probs = sample(
                model, params, inputs, config=config, prefixes=prefixes, sentence_ids=ids, mesh=mesh, rules=rules
            )
            sequences, scores = np.asarray(tokens), np.asarray(log_probs)  # [rows, samples, length], [rows, samples]
        else:
            sequences, scores = beam_search(
                model, params, inputs, config=config, prefixes=prefixes, nbest=nbest, mesh=mesh, rules=rules
            )
            sequences, scores = np.asarray(sequences), np.asarray(scores)  # [rows, nbest, length], [rows, nbest]
        return [
            [
                Hypothesis(self.tokenizer.decode(sequences[row, rank].tolist()), float(scores[row, rank]))
                for rank in range(nbest)
            ]
            for row in range(len(sources))
        ]

    def score(self, sources: Sequence[str], targets: Sequence[str], *, progress: bool = False) -> list[ReferenceScore]:
        """log P(target | source) of each given pair, with its tokens' log-probabilities (teacher forcing; the
        training loss's NLL without label smoothing, negated). Both sides are encoded as in training (pieces + EOS);
        a source longer than max_len is handled by on_too_long, a target longer than max_len is refused."""
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets: score needs one target per source.")
        cfg = self.model_config
        pairs = {}
        for index, (source, target) in enumerate(zip(sources, targets)):
            target_ids = self.tokenizer.encode_target(target) + [cfg.eos_id]
            if len(target_ids) > cfg.max_len:
                raise InputTooLongError(
                    f"target line {index + 1} has {len(target_ids)} tokens, more than the model's max_len="
                    f"{cfg.max_len}; shorten it.",
                    index + 1,
                )
            pairs[index] = (self.encode_source(source, index + 1), target_ids)
        longest = {index: max(map(len, pair)) for index, pair in pairs.items()}
        order = sorted(pairs, key=longest.__getitem__)
        results: list[ReferenceScore] = [ReferenceScore(0.0, []) for _ in sources]
        bar = tqdm(total=len(order), unit="sent", disable=not progress, desc="score", leave=False)
        for batch_indices in self._batches(order, {i: [0] * longest[i] for i in order}):
            inputs = self._inputs([pairs[i][0] for i in batch_indices])
            width = self._width(max(longest[i] for i in batch_indices))
            targets_array = np.full((inputs.shape[0], width), cfg.pad_id, np.int32)  # [rows, width]
            for row, index in enumerate(batch_indices):
                targets_array[row, : len(pairs[index][1])] = pairs[index][1]
            if self.mesh is not None:  # rows split over the devices; the jitted scorer follows its inputs' layout
                rows = sharding.batch_sharding(self.mesh, sharding.rules_for_mesh(self.mesh))
                inputs, targets_array = jax.device_put((inputs, targets_array), rows)
            per_token = np.asarray(token_log_probs(self.model, self.params, inputs, targets_array))  # [rows, width]
            for row, index in enumerate(batch_indices):
                tokens = per_token[row, : len(pairs[index][1])].tolist()
                results[index] = ReferenceScore(float(np.sum(per_token[row])), tokens)
            bar.update(len(batch_indices))
        bar.close()
        return results


def _next_prefix(prefixes: Iterator[str], number: int) -> str:
    """The prefix of input line `number`; running out first is an error naming the line."""
    try:
        return next(prefixes).rstrip("\n")
    except StopIteration:
        raise UserError(f"the prefixes end before input line {number}: give one per input line.") from None
