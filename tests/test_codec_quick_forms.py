"""The record codecs' quick forms change no result and no error: every record encodes, and every
stored object decodes, exactly as the checked field-by-field walk alone does it (the same JSON
object or record, or the same refusal naming the same path), odd values included."""

from __future__ import annotations

import enum
import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from guarded.codec import CODECS, DEFAULT_TYPES, RecordTypes, penguiflow_types
from guarded.errors import InvalidPayloadError

from .test_codec import RECORD_NAMES, SAMPLES


class Moment(datetime):
    """A datetime subclass (the quick forms leave it to the checked walk)."""


class Label(str):
    pass


class Rank(enum.IntEnum):
    ONE = 1


_ABSENT = object()
ODD_VALUES: list[Any] = [
    _ABSENT,
    None,
    "é",
    "\ud800",
    Label("RUNNING"),
    "RUNNING",
    "2024-05-17T13:45:12+05:30",
    "not a date",
    True,
    3,
    Rank.ONE,
    2**70,
    2**1100,
    -0.0,
    1e-5,
    3.5,
    math.nan,
    math.inf,
    [1, (2, 3)],
    {"a": (1, 2), "é": "\ud83d"},
    {1: 2},
    {"x": 2**64},
    Moment(2024, 1, 2, tzinfo=UTC),
    datetime(2024, 1, 2),
    object(),
]


_NOW = re.compile(rf"datetime\.datetime\({datetime.now(UTC).year}, [^)]*\)\)?")
_NOW_SECONDS = re.compile(r"(?<==)[0-9]{10}\.[0-9]+")
"""Default timestamps (a field left out gets the clock's time): masked, two decodings differ in them."""


def _mask_now(text: str) -> str:
    text = _NOW.sub("<now>", text)
    return _NOW_SECONDS.sub(
        lambda found: "<now>" if abs(float(found[0]) - time.time()) < 86400 else found[0], text
    )


def _outcome(function: Any, *args: Any) -> tuple[str, str]:
    try:
        result = function(*args)
    except InvalidPayloadError as exc:
        return "refused", f"{exc.path}: {exc}"
    return type(result).__qualname__, _mask_now(repr(result))


def _variants(fields: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield dict(fields)
    for name in fields:
        for value in ODD_VALUES:
            variant = dict(fields)
            if value is _ABSENT:
                del variant[name]
            else:
                variant[name] = value
            yield variant


def _encodings(name: str, types: RecordTypes) -> list[tuple[str, str]]:
    codec = CODECS[name]
    record = SAMPLES[name](types)
    attributes = {field.name: getattr(record, field.name) for field in codec.fields}
    return [_outcome(codec.encode, record)] + [
        _outcome(codec.encode, SimpleNamespace(**variant)) for variant in _variants(attributes)
    ]


def _decodings(name: str, types: RecordTypes) -> list[tuple[str, str]]:
    codec = CODECS[name]
    stored = codec.encode(SAMPLES[name](DEFAULT_TYPES))
    return [_outcome(codec.decode, variant, types) for variant in _variants(stored)] + [
        _outcome(codec.decode, value, types) for value in (None, [], "{}")
    ]


FAMILIES = {"guarded": DEFAULT_TYPES, "penguiflow": penguiflow_types()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("name", RECORD_NAMES)
def test_quick_encoding_is_the_checked_encoding(
    name: str, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = _encodings(name, FAMILIES[family])
    with monkeypatch.context() as patched:
        for codec in CODECS.values():
            patched.setattr(codec, "quick_encoders", None)
        checked = _encodings(name, FAMILIES[family])
    assert quick == checked
    assert any(kind == "refused" for kind, _ in quick)
    assert any(kind != "refused" for kind, _ in quick)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("name", RECORD_NAMES)
def test_quick_decoding_is_the_checked_decoding(
    name: str, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = _decodings(name, FAMILIES[family])
    with monkeypatch.context() as patched:
        for codec in CODECS.values():
            patched.setattr(codec, "quick_decoders", None)
        checked = _decodings(name, FAMILIES[family])
    assert quick == checked
    assert any(kind == "refused" for kind, _ in quick)
    assert any(kind != "refused" for kind, _ in quick)
