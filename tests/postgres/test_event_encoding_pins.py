"""``encode_event`` keeps producing the rows it produced before its rework, byte for byte.

``event_encoding_pins.json`` was written by the encoder as it was before the rework (commit
6aad3f1), for the events of :mod:`tests.postgres.event_encoding_cases`: the fingerprint of each
event (the primary key's ``event_fp``: rows already in databases carry it, and a retried save
must keep hitting ``ON CONFLICT DO NOTHING``), the stored payload text and the other columns;
and, for refused events, the error's path and reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from guarded.backends.postgres.event_log import encode_event, encode_events
from guarded.errors import InvalidPayloadError

from .event_encoding_cases import refused_events, valid_events

PINS = json.loads((Path(__file__).parent / "event_encoding_pins.json").read_text(encoding="ascii"))
VALID = valid_events()
REFUSED = refused_events()


def _row(event: Any) -> list[Any]:
    row = encode_event(event)
    return [row[0], float.__repr__(row[1]), row[2], row[3], row[4], row[5].hex(), row[6]]


def test_every_case_is_pinned() -> None:
    assert len(PINS["valid"]) == len(VALID) == 425
    assert len(PINS["refused"]) == len(REFUSED) == 22


@pytest.mark.parametrize("index", range(len(PINS["valid"])))
def test_rows_match_the_pinned_rows(index: int) -> None:
    assert _row(VALID[index]) == PINS["valid"][index]["row"]


def test_bulk_rows_match_the_pinned_rows() -> None:
    rows = encode_events(VALID)
    assert [row[5].hex() for row in rows] == [pin["row"][5] for pin in PINS["valid"]]
    assert [row[6] for row in rows] == [pin["row"][6] for pin in PINS["valid"]]


@pytest.mark.parametrize("index", range(len(PINS["refused"])))
def test_refusals_match_the_pinned_reasons(index: int) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        encode_event(REFUSED[index])
    assert str(caught.value) == PINS["refused"][index]["error"]
