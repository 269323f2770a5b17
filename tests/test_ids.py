"""Item ids: text that prints as itself. Control, format and bidi characters could rewrite a
terminal (``delayq list``), forge a log line or hide what an id really is, so they are refused
at the door with a message that says what to pass; every id Celery and RQ make still passes."""

from __future__ import annotations

import pytest

from delayq_backends import Config, DelayStore
from delayq_backends.connection import connect
from delayq_backends.errors import InvalidIdError
from delayq_backends.keys import normalize_id
from delayq_backends.targets import RedisListTarget

BAD = {
    "C0 NUL": "a\x00b",
    "C0 ESC (terminal escape)": "job\x1b[2J\x1b[31mFAKE",
    "C0 newline (forged log line)": "job\nINFO forged line",
    "C0 carriage return": "job\rover",
    "C0 tab": "a\tb",
    "DEL": "a\x7fb",
    "C1 CSI": "a\x9b31m",
    "C1 NEL": "a\x85b",
    "bidi LRE": "a\u202ab",
    "bidi RLO (Trojan Source)": "invoice\u202egpj.exe",
    "bidi PDF": "a\u202cb",
    "bidi LRI": "a\u2066b",
    "bidi PDI": "a\u2069b",
    "LRM": "a\u200eb",
    "RLM": "a\u200fb",
    "arabic letter mark": "a\u061cb",
    "zero-width space (Cf)": "a\u200bb",
    "zero-width joiner (Cf)": "a\u200db",
    "BOM (Cf)": "\ufeffa",
    "soft hyphen (Cf)": "a\u00adb",
    "tag character (Cf)": "a\U000e0041b",
    "line separator": "a\u2028b",
    "paragraph separator": "a\u2029b",
}


@pytest.mark.parametrize("item_id", list(BAD.values()), ids=list(BAD))
def test_ids_with_control_format_or_bidi_characters_are_refused(item_id: str) -> None:
    with pytest.raises(InvalidIdError, match="pass") as info:
        normalize_id(item_id)
    assert "U+" in str(info.value)  # names the character, escaped, not raw
    assert all(c.isprintable() for c in str(info.value))


def test_refused_before_anything_is_stored(valkey_url: str, prefix: str) -> None:
    store = DelayStore(connect(valkey_url), Config(prefix=prefix, shards=2))
    with pytest.raises(InvalidIdError):
        store.schedule("job\x1b[31m", 0, RedisListTarget.envelope("out", b"x"))
    assert store.scheduled() == []
    with pytest.raises(InvalidIdError):
        store.schedule(b"a\xe2\x80\xaeb", 0, RedisListTarget.envelope("out", b"x"))  # RLO as bytes


GOOD = [
    # one of each kind, fixed: every xdist worker must collect the same test ids
    "498fb844-658b-4264-9dbd-a5548400b239",  # Celery task ids (str(uuid4()))
    "8337d1aae83d44949e09c232ce348807",  # RQ's own job ids (uuid4().hex)
    "my-custom.job_id:42/with spaces",  # RQ custom ids may hold anything printable
    "report-2026-11-24T09:00:00+00:00",
    "ünïcödé-ид-标识-🎉",
    "عربي-id",  # right-to-left letters are text, not controls
    "a.b",
    "...",
    ".",  # path segments: the API reaches them by ?id= (tests/test_web)
    "..",
]


@pytest.mark.parametrize("item_id", GOOD)
def test_celery_and_rq_ids_still_pass(item_id: str) -> None:
    assert normalize_id(item_id) == item_id
