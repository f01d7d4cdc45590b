"""Where the autopilot reads demand signals: the :class:`MetricsSource` seam and its Prometheus
implementation.

:class:`PrometheusSource` asks a Prometheus server's HTTP API (``/api/v1/query`` for the
``prometheus`` source's instant reading, ``/api/v1/query_range`` for the ``forecast`` source's
history) through ``prometheus-api-client`` (PyPI ``prometheus-api-client``, maintained by the
Red Hat AIOps team, last release 2026-04): a well-kept client that already handles the API's
envelope, errors and retries. It is synchronous (``requests``), so every call runs in a worker
thread (:func:`asyncio.to_thread`). Answers are checked here: an instant query must give one
finite sample (a scalar, or a vector of exactly one series), a range query at most one series.

The simulator (issue #40, phase 2) plugs its demand trace in through the same
:class:`MetricsSource` protocol, so the real controller runs unchanged there.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from requests import RequestException
from urllib3.util.retry import Retry

from flexlease.errors import MetricsError

Sample = tuple[float, float]
"""(epoch seconds, value)."""


class MetricsSource(Protocol):
    """Reads demand signals. Both methods raise :class:`flexlease.errors.MetricsError`."""

    async def instant(self, query: str) -> float:
        """The value of ``query`` now: one finite number."""
        ...

    async def series(self, query: str, *, seconds: float, step: float) -> list[Sample]:
        """``query`` over the last ``seconds`` at ``step`` seconds, oldest first (empty when the
        series has no data there)."""
        ...


def _number(raw: Any, query: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError) as exc:
        raise MetricsError(f"query {query!r}: sample {raw!r} is not a number") from exc
    return value


def instant_value(result: Any, query: str) -> float:
    """The one finite value of an ``/api/v1/query`` ``data.result`` (a scalar ``[t, "v"]`` or a
    vector ``[{"metric": …, "value": [t, "v"]}]``). Raises :class:`MetricsError` for no series,
    several series, or a value that is not finite."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        value = _number(result[1], query)  # a scalar
    elif isinstance(result, list):
        if not result:
            raise MetricsError(f"query {query!r} returned no series")
        if len(result) > 1:
            labels = ", ".join(str(s.get("metric", {})) for s in result[:3] if isinstance(s, dict))
            raise MetricsError(
                f"query {query!r} returned {len(result)} series, need one (aggregate it): {labels}"
            )
        sample = result[0].get("value") if isinstance(result[0], dict) else None
        if not isinstance(sample, list) or len(sample) != 2:
            raise MetricsError(f"query {query!r}: malformed sample {result[0]!r}")
        value = _number(sample[1], query)
    else:
        raise MetricsError(f"query {query!r}: unexpected result {result!r}")
    if not math.isfinite(value):
        raise MetricsError(f"query {query!r} returned {value} (not a finite number)")
    return value


def range_values(result: Any, query: str) -> list[Sample]:
    """The samples of an ``/api/v1/query_range`` ``data.result`` (a matrix of at most one
    series), oldest first, non-finite ones (NaN from a division by zero, +Inf) left out. Raises
    :class:`MetricsError` for several series or malformed samples."""
    if not isinstance(result, list):
        raise MetricsError(f"query {query!r}: unexpected result {result!r}")
    if not result:
        return []
    if len(result) > 1:
        raise MetricsError(f"query {query!r} returned {len(result)} series, need one (aggregate it)")
    values = result[0].get("values") if isinstance(result[0], dict) else None
    if not isinstance(values, list):
        raise MetricsError(f"query {query!r}: malformed range result {result[0]!r}")
    out: list[Sample] = []
    for point in values:
        if not isinstance(point, list | tuple) or len(point) != 2:
            raise MetricsError(f"query {query!r}: malformed sample {point!r}")
        value = _number(point[1], query)
        if math.isfinite(value):
            out.append((_number(point[0], query), value))
    return out


class PrometheusSource:
    """A :class:`MetricsSource` on the Prometheus server at ``url`` (``http://host:9090``).
    ``timeout_seconds``: per HTTP request; ``headers``: e.g. a bearer token."""

    def __init__(self, url: str, *, timeout_seconds: float, headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self._timeout = max(1, math.ceil(timeout_seconds))  # the client's signature takes whole seconds
        # one retry for a dropped connection; a failed reading is the reactive fallback's case
        retry = Retry(total=1, backoff_factor=0.0, status_forcelist=(502, 503, 504))
        self._client = PrometheusConnect(url=self.url, headers=dict(headers or {}), retry=retry)

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    async def instant(self, query: str) -> float:
        result = await self._call(lambda: self._client.custom_query(query, timeout=self._timeout), query)
        return instant_value(result, query)

    async def series(self, query: str, *, seconds: float, step: float) -> list[Sample]:
        end = datetime.now(UTC)
        start = end - timedelta(seconds=seconds)
        result = await self._call(
            lambda: self._client.custom_query_range(
                query, start_time=start, end_time=end, step=f"{step:g}", timeout=self._timeout
            ),
            query,
        )
        return range_values(result, query)

    async def _call(self, call: Any, query: str) -> Sequence[Any]:
        try:
            result: Sequence[Any] = await asyncio.to_thread(call)
        except PrometheusApiClientException as exc:
            raise MetricsError(f"Prometheus {self.url} refused query {query!r}: {exc}") from exc
        except (RequestException, ValueError) as exc:
            raise MetricsError(f"Prometheus {self.url} unreachable for query {query!r}: {exc}") from exc
        return result
