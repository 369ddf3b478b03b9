"""UnansweredConsumes: keys of consumes that got no answer, reused by the next consume of the item."""

from __future__ import annotations

from guarded.unanswered import UnansweredConsumes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_reused_within_the_grace_period_only() -> None:
    clock = Clock()
    keys = UnansweredConsumes(grace=10, clock=clock)
    keys.remember("tok", "k1")
    keys.remember("tok", "k2")  # the first unanswered key stays: the backend knows that one
    clock.now = 9
    assert keys.key_for("tok") == "k1"
    clock.now = 11
    assert keys.key_for("tok") is None
    assert len(keys) == 0


def test_an_answer_forgets_the_key_and_the_oldest_go_first() -> None:
    keys = UnansweredConsumes(max_items=2)
    keys.remember("a", "ka")
    keys.remember("b", "kb")
    keys.forget("a")
    assert keys.key_for("a") is None
    keys.remember("c", "kc")
    keys.remember("d", "kd")
    assert keys.key_for("b") is None
    assert (keys.key_for("c"), keys.key_for("d")) == ("kc", "kd")
