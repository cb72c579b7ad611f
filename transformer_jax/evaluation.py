"""Translate a split and score it: the one routine behind `transformer-jax evaluate` and validation BLEU."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from transformer_jax.scoring import Scores, score
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


def evaluate_pairs(
    translator: Translator, pairs: Sequence[tuple[str, str]], *, progress: bool = False, moses_lang: str | None = None
) -> Evaluation:
    """Translates the source side of `pairs` and scores it against the raw target side with sacreBLEU
    (with `moses_lang`, the target language, also the Moses-tokenized lowercased BLEU; metrics.score)."""
    sources = [source for source, _ in pairs]
    references = [target for _, target in pairs]
    hypotheses = translator.translate(sources, progress=progress)
    return Evaluation(score(hypotheses, references, moses_lang=moses_lang), sources, references, hypotheses)


EVAL_DIR = "eval"


def save_evaluation(workdir: str | Path, label: str, evaluation: Evaluation, **details) -> Path:
    """Writes {workdir}/eval/{label}.txt (the hypotheses, one per line) and {label}.json (the scores with
    `details`, e.g. split, checkpoint, method, timing); returns the JSON path."""
    directory = Path(workdir) / EVAL_DIR
    directory.mkdir(exist_ok=True)
    (directory / f"{label}.txt").write_text("".join(line + "\n" for line in evaluation.hypotheses), encoding="utf-8")
    path = directory / f"{label}.json"
    path.write_text(json.dumps(dict(dataclasses.asdict(evaluation.scores), **details), indent=2))
    return path
