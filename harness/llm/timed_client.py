"""Requests to a server that end by their deadline, whatever the server does.

httpx's timeouts bound each wait for a byte, not a request: a server that never answers is cut
after the read timeout, but one that sends a byte every few seconds, in its headers or in its
body, holds a request as long as it likes. Here each request is a task on an event loop of the
client's own (one thread), under `asyncio.timeout`: at the deadline the task is cancelled
wherever it is (connecting, sending, waiting, reading), its connection is closed, and the
caller's thread gets a TimeoutError. Nothing is left running.

`CallLimit` is how long one call to a server may take: each attempt `call_timeout` seconds,
the whole call (its attempts and the waits between them) `retries + 1` times that.
`backoff_delay` and `retry_after` are how long to wait before the next attempt.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx


class CallLimit:
    """The time one call may take: `seconds` an attempt, and the whole call, its attempts and
    the waits between them, `total` seconds from its first attempt (`end`, on
    time.monotonic()'s clock, once that has started)."""

    def __init__(self, seconds: float, retries: int) -> None:
        self.seconds, self.total = seconds, seconds * (retries + 1)
        self.end: float | None = None

    @classmethod
    def start(cls, seconds: float | None, retries: int) -> CallLimit | None:
        """The limit of a new call (None: `seconds` is None, no limit)."""
        return None if seconds is None else cls(seconds, retries)

    def left(self) -> float:
        return self.total if self.end is None else self.end - time.monotonic()

    def attempt(self) -> tuple[float, str]:
        """Seconds an attempt starting now may run, and what a cut there says."""
        now = time.monotonic()
        if self.end is None:
            self.end = now + self.total
        left = self.end - now
        if self.seconds <= left:
            return self.seconds, f"no whole answer within {self.seconds:g} s (call_timeout)"
        return left, (
            f"no whole answer by the call's limit, {self.total:g} s ((retries + 1) x call_timeout)"
        )


class TimedClient:
    """POSTs to `base_url` from any thread, each cut at its deadline (see the module)."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: httpx.Timeout, connections: int
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=connections),
        )
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="timed-requests", daemon=True
        )
        self.thread.start()

    def post(self, path: str, body: dict[str, Any], limit: CallLimit | None) -> httpx.Response:
        """The server's whole answer to POST `path` (httpx's errors as they are), or, once an
        attempt starting now reaches its end within `limit`, a TimeoutError saying which."""
        delay, cut = (None, "") if limit is None else limit.attempt()
        try:
            return asyncio.run_coroutine_threadsafe(
                self._post(path, body, delay), self.loop
            ).result()
        except TimeoutError:
            raise TimeoutError(cut) from None

    async def _post(self, path: str, body: dict[str, Any], delay: float | None) -> httpx.Response:
        async with asyncio.timeout(delay):
            return await self.client.post(path, json=body)

    def close(self) -> None:
        """Cancel the requests in flight, close the connections and end the loop's thread."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _cancel_all(self) -> None:
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()


BACKOFF_CAP = 60.0  # seconds: the longest wait between two attempts of our own choosing
RETRY_AFTER_CAP = 300.0  # seconds: the longest Retry-After we honour


def backoff_delay(
    attempt: int,
    base: float,
    draw: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait before retry `attempt` + 1: exponential backoff with full jitter,
    uniform in [0, min(BACKOFF_CAP, base * 2**attempt)], so clients that failed together do
    not come back together."""
    return draw(0.0, min(BACKOFF_CAP, base * 2.0 ** min(attempt, 64)))


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP-date), at most
    RETRY_AFTER_CAP; None when there is none or it cannot be read."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP-date is always GMT
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(RETRY_AFTER_CAP, max(0.0, seconds))
