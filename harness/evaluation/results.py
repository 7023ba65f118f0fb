"""What a candidate process sent back, made into data the trusted process can keep.

The candidate runs in the process that writes the result bytes, so they may be anything; the
functions here bound what decoding them costs and turn every surprise into a one-line reason.
Text that reaches the database goes through `storable` or `one_line`: a lone UTF-16 surrogate
(which a candidate can put in an exception message) becomes U+FFFD.
"""

from __future__ import annotations

import json
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


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line of at most `limit` characters, as storable text."""
    line = " ".join(text[: 4 * limit].split())  # cut first: a 60 MB message is not split whole
    line = _LONE_SURROGATE.sub("\ufffd", line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def storable(text: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", text)
