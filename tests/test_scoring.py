"""metrics.score: sacreBLEU figures and the Moses-tokenized lowercased BLEU of fairseq-style papers."""

import pytest
import sacrebleu

from transformer_jax.scoring import score


def test_moses_lowercase_bleu_equals_bleu_of_hand_tokenized_lowercased_text():
    hypotheses = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!"]
    references = ["Ein Mann fährt ein Fahrrad.", "zwei Hunde spielen im Schnee!"]
    # By hand: Moses splits the final punctuation off; then everything is lowercased.
    hand = (
        ["ein mann fährt fahrrad .", "zwei hunde spielen im schnee !"],
        ["ein mann fährt ein fahrrad .", "zwei hunde spielen im schnee !"],
    )
    scores = score(hypotheses, references, moses_lang="de")
    expected = sacrebleu.corpus_bleu(hand[0], [hand[1]], tokenize="none").score
    assert scores.bleu_moses_lowercase == pytest.approx(expected, abs=1e-9)
    assert "sacremoses" in scores.bleu_moses_lowercase_signature and "tok:none" in scores.bleu_moses_lowercase_signature
    assert scores.bleu < scores.bleu_lowercase  # "zwei" vs "Zwei" costs the cased 13a score only
    assert score(hypotheses, references).bleu_moses_lowercase is None  # only when asked for
