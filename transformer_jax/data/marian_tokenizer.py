"""Marian (OPUS-MT) tokenization: source.spm segments sources, target.spm segments targets, and one joint
vocab.json maps both sides' pieces to ids (transformers' MarianTokenizer without separate vocabularies).

A piece the vocabulary lacks is <unk>; a leading language code `>>xx<<` (multilingual targets) is one piece.
`encode` adds no eos, `decode` stops at eos, as data/tokenizer.py's Tokenizer. The decoder starts from pad, so
bos_id is pad_id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from transformer_jax.config import ModelConfig
from transformer_jax.data.pairs import Pair
from transformer_jax.errors import DataError

SOURCE_SPM, TARGET_SPM, VOCAB = "source.spm", "target.spm", "vocab.json"
FILENAMES = (SOURCE_SPM, TARGET_SPM, VOCAB)
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


class MarianTokenizer:
    """Text ↔ ids with Marian's two SentencePiece models and joint vocabulary."""

    def __init__(self, source: spm.SentencePieceProcessor, target: spm.SentencePieceProcessor, vocab: dict[str, int]):
        missing = [piece for piece in (PAD, EOS, UNK) if piece not in vocab]
        if missing:
            raise DataError(f"the Marian vocabulary has no {', '.join(missing)}; {VOCAB} must hold {PAD, EOS, UNK}.")
        self.source, self.target, self.vocab = source, target, vocab
        self.pieces = {index: piece for piece, index in vocab.items()}
        self.pad_id, self.eos_id, self.unk_id = vocab[PAD], vocab[EOS], vocab[UNK]
        self.bos_id = self.pad_id

    @classmethod
    def from_directory(cls, directory: str | Path) -> MarianTokenizer:
        """Reads source.spm, target.spm and vocab.json from `directory`."""
        directory = Path(directory)
        source, target = (
            spm.SentencePieceProcessor(model_file=str(directory / name)) for name in (SOURCE_SPM, TARGET_SPM)
        )
        return cls(source, target, json.loads((directory / VOCAB).read_text(encoding="utf-8")))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def fingerprint(self) -> str:
        """sha256 of both SentencePiece models and the vocabulary: equal for tokenizers that map text alike."""
        digest = hashlib.sha256(self.source.serialized_model_proto() + self.target.serialized_model_proto())
        digest.update(json.dumps(self.vocab, sort_keys=True).encode())
        return digest.hexdigest()

    def model_config(self, model: ModelConfig) -> ModelConfig:
        """`model` with this vocabulary's special ids, and its size unless the model's embeddings have more rows
        (a Marian model may, beyond the pieces of vocab.json)."""
        vocab_size = max(model.vocab_size, self.vocab_size)
        return model.replace(vocab_size=vocab_size, pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id)

    def _encode(self, processor: spm.SentencePieceProcessor, text: str) -> list[int]:
        code = []
        end = text.find("<<")
        if text.startswith(">>") and end != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return [self.vocab.get(piece, self.unk_id) for piece in code + processor.encode(text, out_type=str)]

    def encode(self, text: str) -> list[int]:
        """A source sentence's ids (source.spm)."""
        return self._encode(self.source, text)

    def encode_target(self, text: str) -> list[int]:
        """A target sentence's ids (target.spm)."""
        return self._encode(self.target, text)

    def encode_pairs(self, pairs: Iterable[Pair]) -> list[tuple[list[int], list[int]]]:
        """[(source ids, target ids)], the input of data.batching."""
        return [(self.encode(source), self.encode_target(target)) for source, target in pairs]

    def decode(self, ids: Sequence[int]) -> str:
        """Target text of `ids` up to the first eos, skipping pad."""
        pieces = []
        for token in (int(token) for token in ids):
            if token == self.eos_id:
                break
            if token != self.pad_id:
                pieces.append(self.pieces.get(token, UNK))
        return self.target.decode_pieces(pieces)
