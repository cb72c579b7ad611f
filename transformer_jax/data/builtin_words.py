"""The vocabulary and grammar of the built-in corpus (builtin_corpus.py): English and German numbers in words,
dates, and noun phrases with German inflection and compounds; and which combinations the test split holds out."""

from __future__ import annotations

import random
from typing import NamedTuple

from transformer_jax.data.pairs import Pair

HELD_OUT_ADJECTIVE_NOUN = frozenset({
    ("red", "cat"), ("blue", "dog"), ("green", "house"), ("old", "car"), ("big", "bird"),
    ("yellow", "flower"), ("small", "horse"), ("black", "chair"), ("white", "boat"),
    ("beautiful", "garden"),
})
HELD_OUT_NUMBER_ENDINGS = (37, 58, 84)  # n % 100; numbers in words only, not digits in dates

# ---------------------------------------------------------------------------------------------- numbers

_EN_UNITS = ("", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
             "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
             "nineteen")
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# German 1 is "eins" at the end of a number and "ein" inside one (einundzwanzig, einhundert).
_DE_UNITS = ("", "ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn",
             "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn",
             "neunzehn")
_DE_TENS = ("", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
            "neunzig")
MAX_NUMBER = 999_999


def _check_number(n: int) -> None:
    if not 1 <= n <= MAX_NUMBER:
        raise ValueError(f"Numbers in words go from 1 to {MAX_NUMBER}, got {n}.")


def english_number(n: int) -> str:
    """British English words: 342 → "three hundred and forty-two", 2005 → "two thousand and five"."""
    _check_number(n)

    def below_100(k: int) -> str:
        if k < 20:
            return _EN_UNITS[k]
        return _EN_TENS[k // 10] + (f"-{_EN_UNITS[k % 10]}" if k % 10 else "")

    def below_1000(k: int) -> str:
        if k < 100:
            return below_100(k)
        return f"{_EN_UNITS[k // 100]} hundred" + (f" and {below_100(k % 100)}" if k % 100 else "")

    thousands, rest = divmod(n, 1000)
    if not thousands:
        return below_1000(rest)
    words = f"{below_1000(thousands)} thousand"
    if rest:
        words += f" and {below_100(rest)}" if rest < 100 else f" {below_1000(rest)}"
    return words


def german_number(n: int) -> str:
    """One German word: 342 → "dreihundertzweiundvierzig", 1001 → "eintausendeins"."""
    _check_number(n)

    def below_100(k: int, final: bool) -> str:
        if k == 1 and final:
            return "eins"
        if k < 20:
            return _DE_UNITS[k]
        return (f"{_DE_UNITS[k % 10]}und" if k % 10 else "") + _DE_TENS[k // 10]

    def below_1000(k: int, final: bool) -> str:
        hundreds = f"{_DE_UNITS[k // 100]}hundert" if k >= 100 else ""
        return hundreds + below_100(k % 100, final)

    thousands, rest = divmod(n, 1000)
    return (f"{below_1000(thousands, final=False)}tausend" if thousands else "") + below_1000(rest, True)


def _is_held_out_number(n: int) -> bool:
    return n % 100 in HELD_OUT_NUMBER_ENDINGS


def sample_number(rng: random.Random, held_out: bool) -> int:
    n = rng.randint(1, 10 ** rng.randint(1, 6) - 1)  # log-uniform magnitude
    if held_out:
        return n - n % 100 + rng.choice(HELD_OUT_NUMBER_ENDINGS)
    return n if not _is_held_out_number(n) else n + 1


# ------------------------------------------------------------------------------------------------ dates

_MONTHS = (("January", "Januar", 31), ("February", "Februar", 28), ("March", "März", 31),
           ("April", "April", 30), ("May", "Mai", 31), ("June", "Juni", 30), ("July", "Juli", 31),
           ("August", "August", 31), ("September", "September", 30), ("October", "Oktober", 31),
           ("November", "November", 30), ("December", "Dezember", 31))


def english_ordinal(day: int) -> str:
    """1 → "1st", 2 → "2nd", 11 → "11th", 23 → "23rd"."""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def _sample_day_month(rng: random.Random, held_out: bool) -> tuple[int, int]:
    """(day, month number); held out exactly when day == month number."""
    if held_out:
        month = rng.randint(1, 12)
        return month, month
    month = rng.randint(1, 12)
    day = rng.randint(1, _MONTHS[month - 1][2] - 1)
    return (day + 1 if day >= month else day), month


def date_pair(rng: random.Random, held_out: bool, with_year: bool) -> Pair:
    """("the 3rd of May 2021", "3. Mai 2021") without the German article, which depends on context."""
    day, month = _sample_day_month(rng, held_out)
    english, german = f"the {english_ordinal(day)} of {_MONTHS[month - 1][0]}", f"{day}. {_MONTHS[month - 1][1]}"
    if with_year:
        year = rng.randint(1900, 2099)
        english, german = f"{english} {year}", f"{german} {year}"
    return english, german


# (English preposition, German preposition + dative article contracted or not)
_DATE_FRAMES = (("", "der"), ("on ", "am"), ("since ", "seit dem"), ("until ", "bis zum"))


def date_example(rng: random.Random, held_out: bool) -> Pair:
    english, german = date_pair(rng, held_out, with_year=rng.random() < 0.7)
    english_prefix, german_prefix = rng.choice(_DATE_FRAMES)
    return f"{english_prefix}{english}", f"{german_prefix} {german}"


# ---------------------------------------------------------------------------------------- noun phrases


class Noun(NamedTuple):
    english: str
    english_plural: str
    german: str
    german_plural: str
    gender: str  # 'm', 'f' or 'n'
    animate: bool = False


class Adjective(NamedTuple):
    english: str
    german_stem: str
    order: int  # English and German both order opinion < size < age < colour


NOUNS = (
    Noun("dog", "dogs", "Hund", "Hunde", "m", True), Noun("cat", "cats", "Katze", "Katzen", "f", True),
    Noun("bird", "birds", "Vogel", "Vögel", "m", True), Noun("horse", "horses", "Pferd", "Pferde", "n", True),
    Noun("mouse", "mice", "Maus", "Mäuse", "f", True), Noun("child", "children", "Kind", "Kinder", "n", True),
    Noun("woman", "women", "Frau", "Frauen", "f", True), Noun("man", "men", "Mann", "Männer", "m", True),
    Noun("house", "houses", "Haus", "Häuser", "n"), Noun("tree", "trees", "Baum", "Bäume", "m"),
    Noun("flower", "flowers", "Blume", "Blumen", "f"), Noun("book", "books", "Buch", "Bücher", "n"),
    Noun("table", "tables", "Tisch", "Tische", "m"), Noun("chair", "chairs", "Stuhl", "Stühle", "m"),
    Noun("car", "cars", "Auto", "Autos", "n"), Noun("apple", "apples", "Apfel", "Äpfel", "m"),
    Noun("door", "doors", "Tür", "Türen", "f"), Noun("garden", "gardens", "Garten", "Gärten", "m"),
    Noun("boat", "boats", "Boot", "Boote", "n"), Noun("ball", "balls", "Ball", "Bälle", "m"),
    Noun("lamp", "lamps", "Lampe", "Lampen", "f"), Noun("bed", "beds", "Bett", "Betten", "n"),
    Noun("key", "keys", "Schlüssel", "Schlüssel", "m"), Noun("window", "windows", "Fenster", "Fenster", "n"),
    Noun("kitchen", "kitchens", "Küche", "Küchen", "f"),
)
_NOUNS_BY_ENGLISH = {noun.english: noun for noun in NOUNS}

# (modifier, head, German form of the modifier inside a compound, with its linking element)
_COMPOUNDS = (
    ("apple", "tree", "Apfel"), ("tree", "house", "Baum"), ("house", "door", "Haus"),
    ("garden", "door", "Garten"), ("car", "door", "Auto"), ("garden", "chair", "Garten"),
    ("car", "key", "Auto"), ("house", "key", "Haus"), ("door", "key", "Tür"),
    ("flower", "garden", "Blumen"), ("dog", "bed", "Hunde"), ("cat", "bed", "Katzen"),
    ("bird", "house", "Vogel"), ("dog", "house", "Hunde"), ("kitchen", "table", "Küchen"),
    ("kitchen", "chair", "Küchen"), ("kitchen", "window", "Küchen"), ("kitchen", "door", "Küchen"),
    ("kitchen", "lamp", "Küchen"), ("garden", "table", "Garten"), ("garden", "lamp", "Garten"),
    ("table", "lamp", "Tisch"), ("apple", "garden", "Apfel"), ("car", "window", "Auto"),
    ("boat", "house", "Boots"), ("bird", "book", "Vogel"), ("flower", "book", "Blumen"),
)


def compound(modifier: str, head: str, german_modifier: str) -> Noun:
    """English "apple tree" → German "Apfelbaum", with the gender and plural of the head noun."""
    head_noun = _NOUNS_BY_ENGLISH[head]
    return Noun(
        f"{modifier} {head}", f"{modifier} {head_noun.english_plural}",
        german_modifier + head_noun.german.lower(), german_modifier + head_noun.german_plural.lower(),
        head_noun.gender,
    )


COMPOUND_NOUNS = tuple(compound(*parts) for parts in _COMPOUNDS)
ALL_NOUNS = NOUNS + COMPOUND_NOUNS
ANIMATE_NOUNS = tuple(noun for noun in NOUNS if noun.animate)

ADJECTIVES = (
    Adjective("beautiful", "schön", 0),
    Adjective("small", "klein", 1), Adjective("big", "groß", 1),
    Adjective("old", "alt", 2), Adjective("new", "neu", 2),
    Adjective("red", "rot", 3), Adjective("blue", "blau", 3), Adjective("green", "grün", 3),
    Adjective("yellow", "gelb", 3), Adjective("black", "schwarz", 3), Adjective("white", "weiß", 3),
)

# Nominative and accusative only; key: gender for singular, 'pl' for plural.
_DER_ARTICLE = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
                "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"}}
_DIESER_ENDING = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
                  "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"}}
_EIN_ENDING = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"},
               "acc": {"m": "en", "f": "e", "n": "", "pl": "e"}}
# Adjective endings: weak after der/dieser, mixed after ein/mein, strong with no article (plural only).
_WEAK_ENDING = {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
                "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"}}
_MIXED_ENDING = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"},
                 "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"}}
_STRONG_PLURAL_ENDING = "e"

# Precomputed choices for sampling.
_HELD_OUT_ANY = tuple((adjective, noun) for adjective in ADJECTIVES for noun in ALL_NOUNS
                      if (adjective.english, noun.english) in HELD_OUT_ADJECTIVE_NOUN)
_HELD_OUT_ANIMATE = tuple((adjective, noun) for adjective, noun in _HELD_OUT_ANY if noun.animate)
_ALLOWED_ADJECTIVES = {noun.english: tuple(adjective for adjective in ADJECTIVES
                                           if (adjective.english, noun.english) not in HELD_OUT_ADJECTIVE_NOUN)
                       for noun in ALL_NOUNS}
_NUMERALS = tuple(n for n in range(2, 100) if not _is_held_out_number(n))  # numeral determiners

_DETERMINERS = ("the", "a", "one", "my", "our", "this", "numeral", "none")
_PLURAL_ONLY, _SINGULAR_ONLY = {"numeral", "none"}, {"a", "one"}


def _english_article_a(next_word: str) -> str:
    return "an" if next_word[0] in "aeiou" else "a"


def noun_phrase(noun: Noun, adjectives: tuple[Adjective, ...], determiner: str, plural: bool,
                case: str, numeral: int = 2) -> Pair:
    """Renders one noun phrase in both languages; `case` is 'nom' or 'acc'.

    `determiner` is one of 'the', 'a', 'one', 'my', 'our', 'this' (these/diese in the plural),
    'numeral' (`numeral` ≥ 2, plural) or 'none' (bare plural).
    """
    key = "pl" if plural else noun.gender
    adjectives = tuple(sorted(adjectives, key=lambda adjective: adjective.order))
    english_words = [adjective.english for adjective in adjectives] + [
        noun.english_plural if plural else noun.english]
    german_noun = noun.german_plural if plural else noun.german
    if determiner in ("the", "this"):
        article = _DER_ARTICLE[case][key] if determiner == "the" else "dies" + _DIESER_ENDING[case][key]
        english_article = "the" if determiner == "the" else ("these" if plural else "this")
        adjective_ending = _WEAK_ENDING[case][key]
    elif determiner in ("a", "one", "my", "our"):
        stem = {"a": "ein", "one": "ein", "my": "mein", "our": "unser"}[determiner]
        article = stem + _EIN_ENDING[case][key]
        english_article = _english_article_a(english_words[0]) if determiner == "a" else determiner
        adjective_ending = _MIXED_ENDING[case][key]
    else:  # numeral or none: no article, strong plural endings
        article = german_number(numeral) if determiner == "numeral" else ""
        english_article = english_number(numeral) if determiner == "numeral" else ""
        adjective_ending = _STRONG_PLURAL_ENDING
    german_words = [article] + [adjective.german_stem + adjective_ending for adjective in adjectives]
    return (" ".join(word for word in [english_article] + english_words if word),
            " ".join(word for word in german_words + [german_noun] if word))


def sample_noun_phrase(rng: random.Random, case: str, held_out: bool, animate: bool) -> tuple[Pair, bool]:
    """A random noun phrase and whether it is plural; it contains a held-out adjective–noun pair iff held_out."""
    if held_out:
        first, noun = rng.choice(_HELD_OUT_ANIMATE if animate else _HELD_OUT_ANY)
        adjectives = [first]
    else:
        noun = rng.choice(ANIMATE_NOUNS if animate else ALL_NOUNS)
        adjectives = []
    allowed = _ALLOWED_ADJECTIVES[noun.english]
    count = max(len(adjectives), rng.choice((0, 1, 1, 2, 2)))
    while len(adjectives) < count:
        used_orders = {adjective.order for adjective in adjectives}
        adjectives.append(rng.choice([a for a in allowed if a.order not in used_orders]))
    determiner = rng.choice(_DETERMINERS)
    plural = determiner in _PLURAL_ONLY or (determiner not in _SINGULAR_ONLY and rng.random() < 0.4)
    numeral = rng.choice(_NUMERALS)
    return noun_phrase(noun, tuple(adjectives), determiner, plural, case, numeral), plural


def noun_phrase_example(rng: random.Random, held_out: bool) -> Pair:
    return sample_noun_phrase(rng, "nom", held_out, animate=False)[0]
