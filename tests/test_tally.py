"""The Tally against a plain recount: after any run of moves by one, ``most`` is the largest count
held and its holders are exactly the clients holding it, in the order they reached it."""

from __future__ import annotations

import random

import pytest

from reachmesh.tally import Tally


@pytest.mark.parametrize("seed", range(40))
def test_moves_by_one_keep_the_most_and_its_holders_as_a_recount_finds_them(seed: int) -> None:
    rng = random.Random(seed)
    tally, held = Tally(), dict.fromkeys("abcdef", 0)
    reached: dict[str, int] = {}  # when each client last reached its count
    for step in range(400):
        client = rng.choice(sorted(held))
        before = held[client]
        after = before + 1 if before == 0 or rng.random() < 0.55 else before - 1
        held[client] = after
        reached[client] = step
        tally.moved(client, before, after)
        most = max(held.values())
        assert tally.most == most
        if most:
            holding = sorted((reached[c], c) for c, n in held.items() if n == most)
            assert list(tally.holders[most]) == [c for _, c in holding]
            assert tally.first_of_most() == holding[0][1] and tally.last_of_most() == holding[-1][1]
        assert sum(len(clients) for clients in tally.holders.values()) == sum(1 for n in held.values() if n)
