"""What a candidate process sent back, made into data the trusted process can keep.

The candidate runs in the process that writes the result bytes, so they may be anything; the
functions here bound what decoding them costs and turn every surprise into a one-line reason.
Text that reaches the database goes through `storable` or `one_line`: a lone UTF-16 surrogate
(which a candidate can put in an exception message) becomes U+FFFD.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from harness.evaluation import zygote

_LONE_SURROGATE = re.compile("[\\ud800-\\udfff]")


def decode_message(payload: bytes) -> tuple[Literal["ok", "error"], Any, str | None]:
    """Decode what the candidate process sent: {"value": data} or {"error": reason}.

    The candidate runs in the process that writes these bytes, so it can write any bytes at all:
    whatever they hold, the answer is an error with a reason, and parsing them costs at most
    `zygote.MAX_VALUES` Python objects beside the bytes themselves.
    """
    if zygote.structure_count(payload) > zygote.MAX_VALUES:
        return "error", None, f"sent a result of more than {zygote.MAX_VALUES:,} values"
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError, MemoryError) as exc:
        return "error", None, f"sent a malformed result: {zygote.one_line(exc)}"
    if type(message) is not dict or len(message) != 1:
        return "error", None, "sent a malformed result: not one value or one error"
    if "error" in message:
        text = message["error"]
        if type(text) is not str:
            return "error", None, "sent a malformed result: the error is not text"
        return "error", None, one_line(text) or "failed without a reason"
    if "value" not in message:
        return "error", None, "sent a malformed result: not one value or one error"
    try:
        return "ok", zygote.decode(message["value"]), None
    except (zygote.CodecError, RecursionError, MemoryError) as exc:
        return "error", None, f"returned data the sandbox cannot accept: {one_line(str(exc))}"
    except Exception as exc:  # a decoder gap must cost this candidate, never the campaign
        reason = f"returned data the sandbox cannot accept: {zygote.one_line(exc)}"
        return "error", None, one_line(reason)


# The most values of a stage's returned data kept beside its scores (`kept`): a fit's ten
# constants and its training error, with room to spare; a construction of thousands is not kept.
KEPT_VALUES = 100


class _TooMany(Exception):
    pass


def kept(value: Any, limit: int = KEPT_VALUES) -> Any:
    """The data a stage returned, as JSON the database stores and a user reads: arrays as
    lists, a float that is not finite as its name ("nan", "inf"), text on one line, anything
    else by its type; or, where it holds more than `limit` values, a sentence saying so."""
    try:
        return _kept(value, [limit])
    except _TooMany:
        return f"not kept: more than {limit} values"


def _kept(value: Any, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooMany
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        value = float(value)  # numpy's float64 is a float, and repr(nan) would say so
        return value if math.isfinite(value) else repr(value)  # JSON columns refuse NaN
    if isinstance(value, str | complex):
        return one_line(str(value), 200)
    if isinstance(value, list | tuple):
        return [_kept(item, budget) for item in value]
    if isinstance(value, dict):
        return {one_line(str(key), 200): _kept(item, budget) for key, item in value.items()}
    size = getattr(value, "size", None)  # a numpy array or scalar
    if isinstance(size, int) and callable(getattr(value, "tolist", None)):
        if size > budget[0]:  # before tolist, which would copy an array of any size
            raise _TooMany
        return _kept(value.tolist(), budget)
    return f"<{type(value).__name__}>"


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line of at most `limit` characters, as storable text."""
    line = " ".join(text[: 4 * limit].split())  # cut first: a 60 MB message is not split whole
    line = _LONE_SURROGATE.sub("\ufffd", line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def storable(text: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", text)
