"""JSON parsed so that a worker thread parsing megabytes does not stall the event loop.

`json.loads` is one C call that holds the GIL from the first byte to the last: run in a thread,
it still stops the event loop (and /healthz) for the whole parse, ~60 ms per 10 MB. `loads` walks
the objects that enclose the data in Python (down to `WALK_DEPTH` levels) and hands each element
of a list to the C decoder whole, so the interpreter can switch threads between elements (every
5 ms, sys.getswitchinterval): a State API reply of 10,000 rows, or the Jobs API's list of 1,000
jobs, costs the loop at most one row's parse at a time. The result is json.loads'.
"""

from __future__ import annotations

import json
from typing import Any

WALK_DEPTH = 6  # objects walked at most this deep (a State API reply's rows are at 4, its envelope's lists)
_DECODER = json.JSONDecoder()
_WHITESPACE = frozenset(" \t\n\r")


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _expect(text: str, i: int, what: str) -> None:
    if text[i:i + 1] != what:
        raise json.JSONDecodeError(f"Expecting {what!r}", text, i)


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    opener = text[i:i + 1]
    if depth <= 0 or opener not in ("[", "{"):
        return _DECODER.raw_decode(text, i)
    closer = "]" if opener == "[" else "}"
    items: Any = [] if opener == "[" else {}
    i = _skip(text, i + 1)
    if text[i:i + 1] == closer:
        return items, i + 1
    while True:
        if opener == "[":  # a list's elements are the rows: each one C call
            item, i = _DECODER.raw_decode(text, i)
            items.append(item)
        else:
            key, i = _DECODER.raw_decode(text, i)
            if not isinstance(key, str):
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
            i = _skip(text, i)
            _expect(text, i, ":")
            items[key], i = _value(text, _skip(text, i + 1), depth - 1)
        i = _skip(text, i)
        if text[i:i + 1] == ",":
            i = _skip(text, i + 1)
            continue
        _expect(text, i, closer)
        return items, i + 1


def loads(text: str, depth: int = WALK_DEPTH) -> Any:
    """json.loads(text), each list element and everything below `depth` levels of objects parsed in one piece."""
    value, end = _value(text, _skip(text, 0), depth)
    if _skip(text, end) != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value
