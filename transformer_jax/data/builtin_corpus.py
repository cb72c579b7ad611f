"""A small English→German translation corpus the project generates offline, for the demo and tests.

Generated deterministically from a seed (`random.Random(seed)`, no global state), the same on every
machine, in well under a second. Six kinds of example, cased as written (English "I" and months, German
nouns), without final punctuation:

- numbers 1..999,999:       "three hundred and forty-two"            → "dreihundertzweiundvierzig"
- dates:                    "on the 3rd of May 2021"                 → "am 3. Mai 2021"
- noun phrases (inflection, compounds):
                            "two small red cats"                     → "zwei kleine rote Katzen"
                            "my old apple tree"                      → "mein alter Apfelbaum"
- sentences (nominative subject, accusative object):
                            "the dogs see a small cat"               → "die Hunde sehen eine kleine Katze"
- verb second after a fronted adverb:
                            "today the dog sees the cat"             → "heute sieht der Hund die Katze"
- verb final in a subordinate clause:
                            "I think that the dog sees the cat"      → "ich denke, dass der Hund die Katze sieht"

Splits: 'train' and 'validation' never contain a held-out combination; every 'test' example contains at
least one, so the test split measures compositional generalisation: adjective–noun pairs in
builtin_words.HELD_OUT_ADJECTIVE_NOUN (e.g. "red cat"), numbers ending in HELD_OUT_NUMBER_ENDINGS (e.g. 37, 1437), and
dates whose day equals the month's number (e.g. the 3rd of March). No English sentence occurs twice in
the corpus, so the splits are disjoint.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import NamedTuple

from transformer_jax.data.builtin_words import (
    date_example,
    date_pair,
    english_number,
    german_number,
    noun_phrase_example,
    sample_noun_phrase,
    sample_number,
)
from transformer_jax.data.pairs import Pair, check_split

DEFAULT_SPLIT_SIZES = {"train": 20_000, "validation": 500, "test": 500}

# -------------------------------------------------------------------------------------------- sentences


class Verb(NamedTuple):
    english: str  # base form; the 3rd person singular adds "s"/"es" (see _english_verb)
    german_1sg: str
    german_3sg: str
    german_plural: str


TRANSITIVE_VERBS = (
    Verb("see", "sehe", "sieht", "sehen"), Verb("like", "mag", "mag", "mögen"),
    Verb("find", "finde", "findet", "finden"), Verb("hear", "höre", "hört", "hören"),
    Verb("buy", "kaufe", "kauft", "kaufen"), Verb("paint", "male", "malt", "malen"),
    Verb("carry", "trage", "trägt", "tragen"), Verb("want", "will", "will", "wollen"),
    Verb("have", "habe", "hat", "haben"), Verb("need", "brauche", "braucht", "brauchen"),
    Verb("chase", "jage", "jagt", "jagen"),
)
SAYING_VERBS = (
    Verb("think", "denke", "denkt", "denken"), Verb("know", "weiß", "weiß", "wissen"),
    Verb("say", "sage", "sagt", "sagen"), Verb("believe", "glaube", "glaubt", "glauben"),
    Verb("hope", "hoffe", "hofft", "hoffen"),
)
# (English, German, person): '1sg', '3sg' or 'pl' (German 1st and 3rd plural forms agree for these verbs).
PRONOUNS = (("I", "ich", "1sg"), ("he", "er", "3sg"), ("she", "sie", "3sg"), ("we", "wir", "pl"),
            ("they", "sie", "pl"))
# Fronted adverbials that put the German verb second: "heute sieht der Hund ...".
ADVERBS = (("today", "heute"), ("now", "jetzt"), ("sometimes", "manchmal"), ("in the morning", "am Morgen"),
           ("in the evening", "am Abend"), ("every day", "jeden Tag"))


def _english_verb(verb: Verb, person: str) -> str:
    if person != "3sg":
        return verb.english
    irregular = {"have": "has", "carry": "carries"}
    return irregular.get(verb.english, verb.english + "s")


def _german_verb(verb: Verb, person: str) -> str:
    return {"1sg": verb.german_1sg, "3sg": verb.german_3sg, "pl": verb.german_plural}[person]


class Clause(NamedTuple):
    english: str  # subject verb object
    german_subject: str
    german_verb: str
    german_object: str


def _sample_clause(rng: random.Random, held_out: bool) -> Clause:
    """Subject (noun phrase or pronoun), transitive verb, accusative object."""
    held_slot = rng.choice(("subject", "object")) if held_out else None
    if rng.random() < 0.3:
        english_subject, german_subject, person = rng.choice(PRONOUNS)
        held_slot = "object" if held_out else None
    else:
        (english_subject, german_subject), plural = sample_noun_phrase(
            rng, "nom", held_slot == "subject", animate=True)
        person = "pl" if plural else "3sg"
    (english_object, german_object), _ = sample_noun_phrase(rng, "acc", held_slot == "object", animate=False)
    verb = rng.choice(TRANSITIVE_VERBS)
    return Clause(f"{english_subject} {_english_verb(verb, person)} {english_object}",
                  german_subject, _german_verb(verb, person), german_object)


def _sentence_example(rng: random.Random, held_out: bool) -> Pair:
    clause = _sample_clause(rng, held_out)
    return clause.english, f"{clause.german_subject} {clause.german_verb} {clause.german_object}"


def _verb_second_example(rng: random.Random, held_out: bool) -> Pair:
    """Fronted adverbial (a time adverb or a date), then German inverts subject and verb."""
    date_held_out = held_out and rng.random() < 0.3
    clause = _sample_clause(rng, held_out and not date_held_out)
    if date_held_out or rng.random() < 0.25:
        english_date, german_date = date_pair(rng, date_held_out, with_year=False)
        english_adverb, german_adverb = f"on {english_date}", f"am {german_date}"
    else:
        english_adverb, german_adverb = rng.choice(ADVERBS)
    return (f"{english_adverb} {clause.english}",
            f"{german_adverb} {clause.german_verb} {clause.german_subject} {clause.german_object}")


def _verb_final_example(rng: random.Random, held_out: bool) -> Pair:
    """"I think that ..." → "ich denke, dass ...": the subordinate clause puts its verb last."""
    english_pronoun, german_pronoun, person = rng.choice(PRONOUNS)
    verb = rng.choice(SAYING_VERBS)
    clause = _sample_clause(rng, held_out)
    return (f"{english_pronoun} {_english_verb(verb, person)} that {clause.english}",
            f"{german_pronoun} {_german_verb(verb, person)}, dass "
            f"{clause.german_subject} {clause.german_object} {clause.german_verb}")


def _number_example(rng: random.Random, held_out: bool) -> Pair:
    n = sample_number(rng, held_out)
    return english_number(n), german_number(n)


# (generator, weight): each generator(rng, held_out) returns one (English, German) pair.
_EXAMPLE_KINDS: tuple[tuple[Callable[[random.Random, bool], Pair], float], ...] = (
    (_number_example, 0.15), (date_example, 0.10), (noun_phrase_example, 0.20),
    (_sentence_example, 0.20), (_verb_second_example, 0.15), (_verb_final_example, 0.20),
)


def generate_corpus(seed: int = 0, split_sizes: dict[str, int] | None = None) -> dict[str, list[Pair]]:
    """{split: [(english, german), ...]} with `split_sizes` (default DEFAULT_SPLIT_SIZES) pairs each.

    Test is drawn first from held-out combinations, then validation and train from the rest; an English
    sentence already drawn is drawn again, so no English sentence repeats across or within splits.
    """
    split_sizes = dict(DEFAULT_SPLIT_SIZES if split_sizes is None else split_sizes)
    for split in split_sizes:
        check_split(split)
    rng = random.Random(seed)
    generators, weights = zip(*_EXAMPLE_KINDS)
    seen: set[str] = set()
    corpus = {}
    for split in sorted(split_sizes, key=lambda name: name != "test"):
        pairs: list[tuple[str, str]] = []
        attempts = 0
        while len(pairs) < split_sizes[split]:
            attempts += 1
            if attempts > 20 * split_sizes[split] + 1000:
                raise ValueError(f"Cannot draw {split_sizes[split]} distinct {split!r} pairs; ask for fewer.")
            generator = rng.choices(generators, weights)[0]
            english, german = generator(rng, split == "test")
            if english not in seen:
                seen.add(english)
                pairs.append((english, german))
        corpus[split] = pairs
    return {split: corpus[split] for split in split_sizes}


@dataclasses.dataclass
class BuiltinCorpusSource:
    """The generated corpus as a ParallelSource (English → German); generated on first use."""

    seed: int = 0
    split_sizes: dict[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SPLIT_SIZES))
    source_lang: str = dataclasses.field(default="en", init=False)
    target_lang: str = dataclasses.field(default="de", init=False)
    _corpus: dict[str, list[Pair]] | None = dataclasses.field(default=None, init=False, repr=False)

    def pairs(self, split: str) -> Iterator[Pair]:
        check_split(split)
        if self._corpus is None:
            self._corpus = generate_corpus(self.seed, self.split_sizes)
        yield from self._corpus.get(split, [])
