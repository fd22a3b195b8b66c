"""Look-alike task names: the rule that keeps one declared name from printing like another.

``TASK_PATTERN`` accepts letters of any script, so without this rule ``pаy_task`` (a Cyrillic
``а``), ``ｐａｙ＿ｔａｓｋ`` (full-width forms), ``pay_task`` plus a combining accent, or ``pay`` + a
zero-width joiner + ``task`` would each print like (or nearly like) ``pay_task`` in logs, metrics
and ``GET /admin/agents``, and an operator could not tell an impostor from the real task.
Chinese, Japanese and other non-Latin names must stay allowed, so the rule is not "ASCII only"
(agent ids already are). A declared task name is refused when it:

1. carries an invisible character: a format character (category Cf: zero-width joiner,
   non-joiner and space, BOM, soft hyphen, bidi controls) or another default-ignorable one
   (variation selectors, the combining grapheme joiner, Hangul fillers);
2. carries a combining mark that does not belong to the script of the letter it sits on: a
   generic accent (U+0301) can sit on any Latin letter, while a Devanagari or Thai vowel sign is
   part of writing those scripts and stays allowed;
3. is not in NFKC form. We refuse rather than store the normalised form: the Router sends each
   agent the task name it declared, so silently storing ``pay_task`` for ``ｐａｙ＿ｔａｓｋ`` would
   hand the agent a name it does not know; it would also fold the registrant into the real
   ``pay_task`` pool without anyone having written ``pay_task``. A refusal that names the NFKC
   form is visible, and what the YAML says is what the logs show;
4. mixes scripts beyond UTS #39's "highly restrictive" level: one script, or Latin together
   with Han and the scripts written beside it (Hiragana and Katakana, Bopomofo, or Hangul). So
   Latin with Cyrillic or Greek is refused, and ``查询_price_v2`` or ``価格を調べる`` is fine;
5. is written wholly in Cyrillic or Greek letters that each have a Latin look-alike (``сору``
   prints like ``copy``): UTS #39 calls this a whole-script confusable. A real Russian or Greek
   word (``оплата``, ``πληρωμή``) has letters without a Latin twin and stays allowed.

Agent ids are ASCII (``[a-z0-9._-]``), so none of the above applies to them; what can make two
ids print alike is punctuation: ``agent-alpha.`` or ``agent-alpha-`` reads as ``agent-alpha`` in a
log line or a table, and ``agent--alpha`` nearly so. An id is therefore runs of letters and digits
joined by single separators, and a task name may not end in a separator either.

Scripts are read from ``unicodedata.name`` (its first word: LATIN, CYRILLIC, CJK, HIRAGANA...),
so this needs nothing beyond the standard library. Letters within one script that look alike
(Latin ``l`` and ``I``) are not this rule's business. Free text a caller sends as ``targetTask``
for routing by meaning is not checked: it only ever matches a declared name exactly.
"""

from __future__ import annotations

import unicodedata
from itertools import pairwise

# Default-ignorable code points that are not format characters (Cf is refused as a category):
# they render as nothing, so they can make two names differ invisibly.
_IGNORABLE = frozenset(
    [
        *(0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0),
        *range(0x180B, 0x1810),  # Mongolian free variation selectors and vowel separator
        *range(0xFE00, 0xFE10),  # variation selectors 1-16
        *range(0xE0100, 0xE01F0),  # variation selectors 17-256
    ]
)

# Longer names are refused by TASK_PATTERN; they are not walked here.
MAX_NAME_CHARS = 128

# UTS #39 "highly restrictive": the script combinations that are ordinary writing.
_CJK_SETS = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)
# Cyrillic and Greek letters that print like a Latin letter in common fonts (from UTS #39's
# confusables.txt, the unmistakable ones only), with that Latin letter.
_LATIN_TWINS = dict(
    zip(
        "асԁеһіјӏорԛѕуԝхАВЕКМНОРСТХЅІЈҮԚԜӀαικνορυΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",
        "acdehijlopqsywxABEKMHOPCTXSIJYQWIaikvopuABEZHIKMNOPTYX",
        strict=True,
    )
)
# Unicode names whose first word is not the script's name.
_SCRIPT_ALIASES = {"CJK": "HAN", "IDEOGRAPHIC": "HAN", "EXTENDED": "ARABIC"}


def _describe(char: str) -> str:
    return f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')})"


def script_of(char: str) -> str | None:
    """The script of a letter, mark or digit by its Unicode name; None for ASCII and punctuation.

    ASCII digits, ``_`` and the other separators are shared by every script, so they never
    make a name mixed. An unfamiliar first word counts as a script of its own, which is safe:
    it can only make a name refused when mixed, never let a look-alike through.
    """
    if char.isascii() and not char.isalpha():
        return None
    if unicodedata.category(char)[0] not in "LMN":
        return None
    # A letter this Python's Unicode tables do not name (Tangut, in 14.0) is a script of its own.
    word = unicodedata.name(char, "UNNAMED").split(" ", 1)[0].split("-", 1)[0]
    return _SCRIPT_ALIASES.get(word, word)


def _invisible(name: str) -> str | None:
    for char in name:
        if unicodedata.category(char) == "Cf" or ord(char) in _IGNORABLE:
            return f"carries the invisible character {_describe(char)}"
    return None


def _stray_mark(name: str) -> str | None:
    base: str | None = None
    for char in name:
        if unicodedata.category(char)[0] != "M":
            base = script_of(char)
        elif base is None or script_of(char) != base:
            # A mark named COMBINING... is of no script (it attaches to anything), and a mark
            # of another script than its letter's is a disguise, not spelling.
            return f"carries the combining mark {_describe(char)}, which does not belong to its letter"
    return None


def _not_nfkc(name: str) -> str | None:
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        return f"is not in NFKC form (full-width or compatibility characters); write it as {normal!r}"
    return None


def _mixed_scripts(name: str) -> str | None:
    seen: dict[str, str] = {}
    for char in name:
        script = script_of(char)
        if script is not None and unicodedata.category(char)[0] != "M":
            seen.setdefault(script, char)
    scripts = frozenset(seen)
    if len(scripts) <= 1 or any(scripts <= allowed for allowed in _CJK_SETS):
        return None
    # Name the first letter of the second script: in pаy_task that is the Cyrillic а.
    second = list(seen)[1]
    return (
        f"mixes the scripts {' and '.join(seen)}, at {_describe(seen[second])}; a name uses one "
        "script, or Latin with Chinese, Japanese or Korean, so that no letter can pass for another"
    )


def _latin_twin(name: str) -> str | None:
    letters = [char for char in name if char.isalpha()]
    if not letters or not all(char in _LATIN_TWINS for char in letters):
        return None
    twin = "".join(_LATIN_TWINS.get(char, char) for char in name)
    script = script_of(letters[0])
    return f"is written in {script} letters that all have Latin look-alikes; it prints like {twin!r}"


_SEPARATORS = frozenset("._-:")


def _trailing_separator(name: str) -> str | None:
    if name and name[-1] in _SEPARATORS:
        return f"ends in {name[-1]!r}, so it prints like {name.rstrip('._-:')!r}"
    return None


def look_alike_problem(name: str) -> str | None:
    """Why ``name`` could pass for another task name, or None when it cannot (rules above)."""
    for rule in (_invisible, _stray_mark, _not_nfkc, _mixed_scripts, _latin_twin, _trailing_separator):
        problem = rule(name)
        if problem is not None:
            return problem
    return None


def check_task_name(value: object) -> object:
    """A pydantic before-validator: refuse a look-alike task name with the rule it breaks.

    Non-strings and over-long strings pass through untouched: the type and length checks that
    follow refuse them, and a 10 MB string is not walked character by character here.
    """
    if isinstance(value, str) and len(value) <= MAX_NAME_CHARS:
        problem = look_alike_problem(value)
        if problem is not None:
            raise ValueError(f"task name {problem}")
    return value


def agent_id_problem(agent_id: str) -> str | None:
    """Why an ASCII agent id could pass for another (a separator at an end, or two in a row)."""
    if not agent_id:
        return None
    if agent_id[0] in _SEPARATORS:
        return f"starts with {agent_id[0]!r}; an id starts with a letter or digit"
    trailing = _trailing_separator(agent_id)
    if trailing is not None:
        return trailing
    for first, second in pairwise(agent_id):
        if first in _SEPARATORS and second in _SEPARATORS:
            return f"has {first + second!r} in a row; separators stand alone, so no id can pass for another"
    return None


def check_agent_id(value: object) -> object:
    """A pydantic before-validator: refuse an agent id that could pass for another, saying why.

    Non-strings and over-long ones pass through to the pattern and length checks that follow.
    """
    if isinstance(value, str) and len(value) <= MAX_NAME_CHARS:
        problem = agent_id_problem(value)
        if problem is not None:
            raise ValueError(f"agent id {problem}")
    return value
