"""Translation quality with sacreBLEU: BLEU (13a, cased), lowercased BLEU and chrF, with signatures."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import sacrebleu


@dataclasses.dataclass(frozen=True)
class Scores:
    """Corpus-level scores of detokenized hypotheses against raw references."""

    bleu: float
    bleu_lowercase: float
    chrf: float
    bleu_signature: str
    bleu_lowercase_signature: str
    chrf_signature: str
    sentences: int

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f} | lowercased BLEU {self.bleu_lowercase:.2f} | chrF {self.chrf:.2f} "
                f"({self.sentences} sentences)\n  {self.bleu_signature}\n  {self.bleu_lowercase_signature}\n"
                f"  {self.chrf_signature}")


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU with its defaults (tokenize='13a', cased) plus lowercased BLEU and chrF."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must pair up "
                         "line by line.")
    bleu = sacrebleu.metrics.BLEU()
    bleu_lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    refs = [list(references)]
    return Scores(
        bleu=bleu.corpus_score(hypotheses, refs).score,
        bleu_lowercase=bleu_lowercase.corpus_score(hypotheses, refs).score,
        chrf=chrf.corpus_score(hypotheses, refs).score,
        bleu_signature=str(bleu.get_signature()),
        bleu_lowercase_signature=str(bleu_lowercase.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        sentences=len(hypotheses),
    )
