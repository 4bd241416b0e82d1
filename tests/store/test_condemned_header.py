"""A condemned list whose header holds numbers as text ("nan", "1e999"), or counts and packs of the wrong type, is a
damaged list naming itself (gc condemns its objects again), never a list dated NaN that no gc ever sweeps."""

import json

import pytest

import casmon
from casmon.store import condemned
from casmon.store.codec import KIND_TABLE, encode_frame
from casmon.store.codec import get_codec


def _list(head: dict) -> bytes:
    raw = json.dumps(head).encode()
    payload = condemned._MAGIC + condemned._U32.pack(len(raw)) + raw
    return encode_frame(payload, KIND_TABLE, get_codec("none"))[1]


@pytest.mark.parametrize("head", [{"time": "nan", "count": 0, "entries": 0, "packs": []},
                                  {"time": "1e999", "count": 0, "entries": 0, "packs": []},
                                  {"time": -5.0, "count": 0, "entries": 0, "packs": []},
                                  {"time": 1.7e9, "count": "0", "entries": 0, "packs": []},
                                  {"time": 1.7e9, "count": 0, "entries": 0.0, "packs": []},
                                  {"time": 1.7e9, "count": 0, "entries": 0, "packs": "ab"},
                                  {"time": 1.7e9, "count": 0, "entries": 0, "packs": [1]}])
def test_a_condemned_header_of_the_wrong_types_is_damage(head):
    with pytest.raises(casmon.DamagedObjectError, match="gc/condemned/x"):
        condemned.decode("x", _list(head))


def test_a_sound_header_reads():
    assert condemned.decode("x", _list({"time": 1.7e9, "count": 0, "entries": 0, "packs": []})).time == 1.7e9
