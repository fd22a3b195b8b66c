"""Split the evaluation corpus once into a calibration half and a held-out half.

    python scripts/split_eval.py            # writes tests/data/eval/split.yaml

Run once, when the corpus arrived, before any score was looked at; the result is committed and
never regenerated (the script refuses to overwrite it). Questions are grouped by (expected task,
language, kind) and each group is shuffled with a fixed seed and dealt alternately, so both halves
hold every capability, both languages and every kind of phrasing in the same proportions. Odd
groups give their extra question to the two halves in turn, counted per (language, kind), so a
kind with one question per capability (typos) is split half and half across capabilities.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import yaml

SEED = 20261130
HERE = Path(__file__).resolve().parent.parent / "tests" / "data" / "eval"


def main() -> int:
    target = HERE / "split.yaml"
    if target.exists() and "--force" not in sys.argv:
        print(f"{target} exists: the split is made once and never changed", file=sys.stderr)
        return 1
    raw = (HERE / "questions.yaml").read_bytes()
    questions = yaml.safe_load(raw)
    strata: dict[tuple[str, str, str], list[int]] = {}
    for i, q in enumerate(questions):
        strata.setdefault((str(q["expect"]), q["lang"], q["kind"]), []).append(i)
    halves: dict[str, list[int]] = {"calibration": [], "heldout": []}
    names = ("calibration", "heldout")
    turns: dict[tuple[str, str], int] = {}
    for key in sorted(strata):
        ids = strata[key]
        random.Random(f"{SEED}:{'/'.join(key)}").shuffle(ids)
        turn = turns.get(key[1:], 0)
        for j, i in enumerate(ids):
            halves[names[(j + turn) % 2]].append(i)
        turns[key[1:]] = turn + len(ids) % 2
    out = {
        "seed": SEED,
        "questions_sha256": hashlib.sha256(raw).hexdigest(),
        "calibration": sorted(halves["calibration"]),
        "heldout": sorted(halves["heldout"]),
    }
    header = "# Made once by scripts/split_eval.py before any score was looked at; never regenerated.\n"
    target.write_text(header + yaml.safe_dump(out, default_flow_style=None, width=100))
    print(f"calibration {len(out['calibration'])}, held-out {len(out['heldout'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
