"""Translation quality with sacreBLEU: BLEU (13a, cased), lowercased BLEU and chrF, with signatures; optionally
the BLEU that fairseq-style papers report (hypotheses and references Moses-tokenized and lowercased, then scored
with no further tokenization), named as such because it is not comparable with the 13a figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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
    bleu_moses_lowercase: float | None = None  # see moses_lowercase_bleu
    bleu_moses_lowercase_signature: str | None = None

    def summary(self) -> str:
        text = (
            f"BLEU {self.bleu:.2f} | lowercased BLEU {self.bleu_lowercase:.2f} | chrF {self.chrf:.2f} "
            f"({self.sentences} sentences)\n  {self.bleu_signature}\n  {self.bleu_lowercase_signature}\n"
            f"  {self.chrf_signature}"
        )
        if self.bleu_moses_lowercase is not None:
            text += (
                f"\n  Moses-tokenized lowercased BLEU (fairseq-style papers) {self.bleu_moses_lowercase:.2f}: "
                f"{self.bleu_moses_lowercase_signature}"
            )
        return text


def moses_lowercase_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> tuple[float, str]:
    """(BLEU, description) of Moses-tokenized (sacremoses, `lang`), lowercased text, scored with tokenize='none'."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)

    def prepare(lines):
        return [tokenizer.tokenize(line, escape=False, return_str=True).lower() for line in lines]

    bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    value = bleu.corpus_score(prepare(hypotheses), [prepare(references)]).score
    return value, f"sacremoses tokenizer (lang {lang}) + lowercase, then {bleu.get_signature()}"


def score(hypotheses: Sequence[str], references: Sequence[str], *, moses_lang: str | None = None) -> Scores:
    """sacreBLEU with its defaults (tokenize='13a', cased) plus lowercased BLEU and chrF; with `moses_lang`, also
    the Moses-tokenized lowercased BLEU of fairseq-style papers."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must pair up line by line."
        )
    bleu = sacrebleu.metrics.BLEU()
    bleu_lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    refs = [list(references)]
    moses = moses_lowercase_bleu(hypotheses, references, moses_lang) if moses_lang else (None, None)
    return Scores(
        bleu=bleu.corpus_score(hypotheses, refs).score,
        bleu_lowercase=bleu_lowercase.corpus_score(hypotheses, refs).score,
        chrf=chrf.corpus_score(hypotheses, refs).score,
        bleu_signature=str(bleu.get_signature()),
        bleu_lowercase_signature=str(bleu_lowercase.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        sentences=len(hypotheses),
        bleu_moses_lowercase=moses[0],
        bleu_moses_lowercase_signature=moses[1],
    )
