"""UnansweredConsumes: keys of consumes that got no answer, claimed by one later consume at a time."""

from __future__ import annotations

from guarded.pipeline.unanswered import UnansweredConsumes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_kept_within_the_grace_period_only() -> None:
    clock = Clock()
    keys = UnansweredConsumes(grace=10, clock=clock)
    keys.remember("tok", "k1")
    clock.now = 5
    keys.remember("tok", "k2")
    keys.remember("tok", "k1")  # kept once
    clock.now = 9
    assert keys.keys_for("tok") == ("k1", "k2")
    clock.now = 11
    assert keys.keys_for("tok") == ("k2",)
    assert keys.claim("tok") == (("k2", 5),)
    clock.now = 16
    keys.restore("tok", (("k2", 5),))
    assert keys.claim("tok") == ()  # outlived the grace period


def test_a_claim_takes_the_keys_until_they_are_restored() -> None:
    keys = UnansweredConsumes()
    keys.remember("tok", "k1")
    claimed = keys.claim("tok")
    assert [key for key, _ in claimed] == ["k1"]
    assert keys.claim("tok") == ()  # a concurrent consume recovers nothing
    keys.remember("tok", "k2")  # the claiming consume got no answer either
    keys.restore("tok", claimed)
    assert keys.keys_for("tok") == ("k1", "k2")
    assert keys.claim("other") == ()


def test_the_oldest_items_and_keys_go_first() -> None:
    clock = Clock()
    keys = UnansweredConsumes(max_items=2, max_keys=2, clock=clock)
    keys.remember("a", "ka")
    keys.remember("b", "kb")
    keys.remember("c", "kc")
    assert (keys.keys_for("a"), keys.keys_for("b"), keys.keys_for("c")) == ((), ("kb",), ("kc",))
    for index in range(3):
        clock.now = index
        keys.remember("c", f"c{index}")
    assert keys.keys_for("c") == ("c1", "c2")
    assert len(keys) == 2
