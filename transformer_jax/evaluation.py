"""Translate a split and score it: the one routine behind `transformer-jax evaluate` and validation BLEU."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transformer_jax.metrics import Scores, score
from transformer_jax.translate import Translator


@dataclasses.dataclass(frozen=True)
class Evaluation:
    scores: Scores
    sources: list[str]
    references: list[str]
    hypotheses: list[str]

    def samples(self, count: int = 5) -> str:
        """A few translations beside their sources and references, for a terminal."""
        lines = []
        for source, hypothesis, reference in list(zip(self.sources, self.hypotheses, self.references))[:count]:
            lines += [f"  source:     {source}", f"  output:     {hypothesis}", f"  reference:  {reference}", ""]
        return "\n".join(lines)


def evaluate_pairs(translator: Translator, pairs: Sequence[tuple[str, str]], *, progress: bool = False,
                   moses_lang: str | None = None) -> Evaluation:
    """Translates the source side of `pairs` and scores it against the raw target side with sacreBLEU
    (with `moses_lang`, the target language, also the Moses-tokenized lowercased BLEU; metrics.score)."""
    sources = [source for source, _ in pairs]
    references = [target for _, target in pairs]
    hypotheses = translator.translate(sources, progress=progress)
    return Evaluation(score(hypotheses, references, moses_lang=moses_lang), sources, references, hypotheses)
