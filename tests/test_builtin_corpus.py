"""The generated English→German corpus: exact translations, determinism, disjoint splits, held-out combinations."""

import hashlib
import re

import pytest

from transformer_jax.data.builtin_corpus import TRANSITIVE_VERBS, BuiltinCorpusSource, generate_corpus
from transformer_jax.data.builtin_words import (
    ADJECTIVES,
    ALL_NOUNS,
    COMPOUND_NOUNS,
    HELD_OUT_ADJECTIVE_NOUN,
    HELD_OUT_NUMBER_ENDINGS,
    NOUNS,
    english_number,
    english_ordinal,
    german_number,
    noun_phrase,
)

# Changes whenever the generator changes; it must never change between machines or runs.
CORPUS_SHA256 = "df9eb8e16f3f7a3abc0da15fd5e15391fb8e8bc1a4f3c72858ccc46fc334f44f"


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0)


@pytest.mark.parametrize("n, english, german", [
    (1, "one", "eins"),
    (16, "sixteen", "sechzehn"),
    (17, "seventeen", "siebzehn"),
    (21, "twenty-one", "einundzwanzig"),
    (30, "thirty", "dreißig"),
    (101, "one hundred and one", "einhunderteins"),
    (342, "three hundred and forty-two", "dreihundertzweiundvierzig"),
    (1001, "one thousand and one", "eintausendeins"),
    (2021, "two thousand and twenty-one", "zweitausendeinundzwanzig"),
    (121_000, "one hundred and twenty-one thousand", "einhunderteinundzwanzigtausend"),
    (999_999, "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
     "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
])
def test_numbers(n, english, german):
    assert (english_number(n), german_number(n)) == (english, german)


def test_ordinals():
    assert [english_ordinal(d) for d in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st"]


NOUN = {noun.english: noun for noun in ALL_NOUNS}
ADJECTIVE = {adjective.english: adjective for adjective in ADJECTIVES}


@pytest.mark.parametrize("noun, adjectives, determiner, plural, case, expected", [
    ("cat", ("red", "small"), "numeral", True, "nom", ("two small red cats", "zwei kleine rote Katzen")),
    ("dog", ("small", "red"), "a", False, "nom", ("a small red dog", "ein kleiner roter Hund")),
    ("dog", ("small",), "a", False, "acc", ("a small dog", "einen kleinen Hund")),
    ("dog", ("old",), "the", False, "acc", ("the old dog", "den alten Hund")),
    ("house", ("old",), "a", False, "nom", ("an old house", "ein altes Haus")),
    ("house", ("big",), "the", False, "nom", ("the big house", "das große Haus")),
    ("house", ("big",), "this", True, "acc", ("these big houses", "diese großen Häuser")),
    ("cat", ("white",), "my", True, "nom", ("my white cats", "meine weißen Katzen")),
    ("cat", (), "our", False, "acc", ("our cat", "unsere Katze")),
    ("mouse", ("black",), "none", True, "acc", ("black mice", "schwarze Mäuse")),
    ("apple tree", ("old",), "my", False, "nom", ("my old apple tree", "mein alter Apfelbaum")),
    ("apple tree", (), "a", False, "nom", ("an apple tree", "ein Apfelbaum")),
    ("boat house", ("new",), "the", True, "nom", ("the new boat houses", "die neuen Bootshäuser")),
    ("house door", (), "this", False, "acc", ("this house door", "diese Haustür")),
])
def test_noun_phrases(noun, adjectives, determiner, plural, case, expected):
    adjectives = tuple(ADJECTIVE[name] for name in adjectives)
    assert noun_phrase(NOUN[noun], adjectives, determiner, plural, case, numeral=2) == expected


def test_deterministic_and_fixed_across_machines(corpus):
    assert generate_corpus(seed=0) == corpus
    assert hashlib.sha256(repr(sorted(corpus.items())).encode()).hexdigest() == CORPUS_SHA256
    sizes = {"train": 50, "validation": 5, "test": 5}
    assert generate_corpus(seed=1, split_sizes=sizes)["test"] != generate_corpus(seed=0, split_sizes=sizes)["test"]


def test_split_sizes_and_disjoint(corpus):
    assert {split: len(pairs) for split, pairs in corpus.items()} == {"train": 20_000, "validation": 500,
                                                                       "test": 500}
    english = {split: {source for source, _ in pairs} for split, pairs in corpus.items()}
    assert sum(map(len, english.values())) == 21_000  # no English sentence twice, within or across splits
    assert all(german for pairs in corpus.values() for _, german in pairs)


_EN_WORDS = {word: value for value, word in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"])}
_EN_WORDS.update({word: 10 * (i + 2) for i, word in enumerate(
    ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"])})


def parse_english_number(text):
    """Independent oracle: English number words → int, or None if `text` is not only a number."""
    total = current = 0
    for word in text.replace("-", " ").split():
        if word in _EN_WORDS:
            current += _EN_WORDS[word]
        elif word == "hundred":
            current *= 100
        elif word == "thousand":
            total, current = (total + current) * 1000, 0
        elif word != "and":
            return None
    return total + current


_ADJECTIVE_FORMS = {adjective.german_stem + ending: adjective.english
                    for adjective in ADJECTIVES for ending in ("e", "en", "er", "es")}
_NOUN_FORMS = {form: noun.english for noun in ALL_NOUNS for form in (noun.german, noun.german_plural)}


def adjective_noun_combinations(german):
    """(adjective, noun) in English for each German noun and the inflected adjectives just before it."""
    words, found = german.replace(",", "").split(), set()
    for position, word in enumerate(words):
        before = position - 1
        while word in _NOUN_FORMS and before >= 0 and words[before] in _ADJECTIVE_FORMS:
            found.add((_ADJECTIVE_FORMS[words[before]], _NOUN_FORMS[word]))
            before -= 1
    return found


def held_out_reasons(english, german):
    reasons = adjective_noun_combinations(german) & HELD_OUT_ADJECTIVE_NOUN
    number = parse_english_number(english)
    if number is not None and number % 100 in HELD_OUT_NUMBER_ENDINGS:
        reasons.add(("number", number))
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
    for day, month in re.findall(r"the (\d+)(?:st|nd|rd|th) of (\w+)", english):
        if int(day) == months.index(month) + 1:
            reasons.add(("date", day, month))
    return reasons


def test_numbers_in_the_corpus_are_translated_exactly(corpus):
    checked = 0
    for english, german in corpus["train"]:
        number = parse_english_number(english)
        if number is not None:
            assert german == german_number(number) and english == english_number(number)
            checked += 1
    assert checked > 2000


def test_test_split_holds_out_combinations_never_in_train(corpus):
    train_combinations = set()
    for english, german in corpus["train"] + corpus["validation"]:
        assert not held_out_reasons(english, german), (english, german)
        train_combinations |= adjective_noun_combinations(german)
    test_reasons = [held_out_reasons(english, german) for english, german in corpus["test"]]
    assert all(test_reasons)
    kinds = {reason[0] if reason[0] in ("number", "date") else "adjective" for r in test_reasons for reason in r}
    assert kinds == {"number", "date", "adjective"}
    held_adjective_nouns = set().union(*test_reasons) & HELD_OUT_ADJECTIVE_NOUN
    assert len(held_adjective_nouns) == len(HELD_OUT_ADJECTIVE_NOUN)
    # the parts of each held-out pair are seen in training, just never together
    for adjective, noun in HELD_OUT_ADJECTIVE_NOUN:
        assert any(a == adjective for a, _ in train_combinations) and any(n == noun for _, n in train_combinations)


def test_word_order_and_agreement(corpus):
    """Subordinate clauses end in an agreeing verb; fronted adverbials put the verb second."""
    verb_forms = {form for verb in TRANSITIVE_VERBS for form in (verb.german_1sg, verb.german_3sg,
                                                                 verb.german_plural)}
    subordinate = [(e, g) for e, g in corpus["train"] if ", dass " in g]
    assert len(subordinate) > 2000
    for english, german in subordinate:
        assert german.split()[-1] in verb_forms
        if " that I " in english:
            assert german.split()[-1] == next(v.german_1sg for v in TRANSITIVE_VERBS
                                              if english.split(" that I ")[1].split()[0] == v.english)
    fronted = [(e, g) for e, g in corpus["train"] if e.startswith("today the ")]
    assert fronted
    for english, german in fronted:
        assert german.split()[1] in verb_forms and german.split()[2] in ("der", "die", "das")
    assert len(COMPOUND_NOUNS) > 20 and all(noun.german[1:].islower() for noun in COMPOUND_NOUNS + NOUNS)


def test_source_serves_the_splits():
    source = BuiltinCorpusSource(split_sizes={"train": 10, "validation": 3, "test": 3})
    assert (source.source_lang, source.target_lang) == ("en", "de")
    assert len(list(source.pairs("train"))) == 10 and len(list(source.pairs("test"))) == 3
