"""A small metrics registry: counters, gauges and histograms with labels, as Prometheus text.

This module owns metric values and their text exposition (Prometheus format 0.0.4). It does
not serve them: the server's HTTP endpoint calls ``MetricsRegistry.render``. Updates take a
lock, so threads (e.g. native callbacks) and the event loop may both record.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

LabelValues = tuple[str, ...]
_M = TypeVar("_M", bound="_Metric")

# Seconds; covers a sub-millisecond RPC up to a long admin call.
DEFAULT_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class _Metric:
    """What every metric kind shares: a name, help text, label names and a lock."""

    kind = ""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]) -> None:
        self.name = name
        self.help_text = help_text
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {list(self.label_names)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        """The ``# HELP`` and ``# TYPE`` lines."""
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        """One line per series (per bucket for histograms), sorted by label values."""
        raise NotImplementedError


class Counter(_Metric):
    """A value that only goes up (requests served, bytes written)."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Adds ``amount`` (≥ 0) to the series named by ``labels``."""
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot go down (amount {amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """The current value of one series (0 if never incremented)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [
            f"{self.name}{_format_labels(self.label_names, k)} {_format_value(v)}" for k, v in items
        ]


class Gauge(_Metric):
    """A value that goes up and down, set directly or read from a callback at render time."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelValues, float] = {}
        self._callback: Callable[[], Iterable[tuple[dict[str, str], float]]] | None = None

    def set(self, value: float, **labels: str) -> None:
        """Sets the series named by ``labels`` to ``value``."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Adds ``amount`` (may be negative) to the series named by ``labels``."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def remove(self, **labels: str) -> None:
        """Drops one series (e.g. a tablet that was deleted)."""
        key = self._key(labels)
        with self._lock:
            self._values.pop(key, None)

    def value(self, **labels: str) -> float:
        """The current stored value of one series (0 if never set)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def set_callback(self, callback: Callable[[], Iterable[tuple[dict[str, str], float]]]) -> None:
        """Reads the series from ``callback`` at each render instead of stored values."""
        self._callback = callback

    def samples(self) -> list[str]:
        if self._callback is not None:
            items = sorted((self._key(labels), float(v)) for labels, v in self._callback())
        else:
            with self._lock:
                items = sorted(self._values.items())
        return [
            f"{self.name}{_format_labels(self.label_names, k)} {_format_value(v)}" for k, v in items
        ]


class ObservedCounter(Gauge):
    """A counter whose series are read from ``set_callback`` at each render (the totals live
    elsewhere, e.g. plain ints on each tablet replica, so the hot path pays no lock)."""

    kind = "counter"


class _HistogramSeries:
    __slots__ = ("bucket_counts", "count", "total")

    def __init__(self, bucket_count: int) -> None:
        self.bucket_counts = [0] * bucket_count  # per bucket, not cumulative
        self.count = 0
        self.total = 0.0


class Histogram(_Metric):
    """Observations counted into fixed buckets (upper bounds), plus their count and sum."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS_S,
    ) -> None:
        super().__init__(name, help_text, label_names)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be strictly increasing and non-empty")
        self.buckets = tuple(float(b) for b in buckets)
        self._series: dict[LabelValues, _HistogramSeries] = {}

    def observe(self, value: float, **labels: str) -> None:
        """Counts ``value`` into its bucket of the series named by ``labels``."""
        key = self._key(labels)
        # Bucket i holds values <= buckets[i]; the last slot is +Inf.
        slot = bisect.bisect_left(self.buckets, value)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _HistogramSeries(len(self.buckets) + 1)
            series.bucket_counts[slot] += 1
            series.count += 1
            series.total += value

    def count(self, **labels: str) -> int:
        """How many values the series named by ``labels`` has observed."""
        key = self._key(labels)
        with self._lock:
            series = self._series.get(key)
            return 0 if series is None else series.count

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(
                (k, list(s.bucket_counts), s.count, s.total) for k, s in self._series.items()
            )
        lines: list[str] = []
        for key, bucket_counts, count, total in items:
            cumulative = 0
            bounds = [*self.buckets, math.inf]
            for bound, in_bucket in zip(bounds, bucket_counts, strict=True):
                cumulative += in_bucket
                labels = _format_labels((*self.label_names, "le"), (*key, _format_value(bound)))
                lines.append(f"{self.name}_bucket{labels} {cumulative}")
            assert cumulative == count
            base = _format_labels(self.label_names, key)
            lines.append(f"{self.name}_sum{base} {_format_value(total)}")
            lines.append(f"{self.name}_count{base} {count}")
        return lines


class MetricsRegistry:
    """The metrics of one process, rendered together. Names are unique."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _register(self, metric: _M) -> _M:
        with self._lock:
            existing = self._metrics.get(metric.name)
            if existing is not None:
                raise ValueError(f"metric {metric.name} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Counter:
        """Registers and returns a new counter."""
        return self._register(Counter(name, help_text, label_names))

    def gauge(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Gauge:
        """Registers and returns a new gauge."""
        return self._register(Gauge(name, help_text, label_names))

    def observed_counter(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str],
        callback: Callable[[], Iterable[tuple[dict[str, str], float]]],
    ) -> ObservedCounter:
        """Registers a counter read from ``callback`` at each render."""
        counter = self._register(ObservedCounter(name, help_text, label_names))
        counter.set_callback(callback)
        return counter

    def histogram(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS_S,
    ) -> Histogram:
        """Registers and returns a new histogram (``buckets`` are inclusive upper bounds)."""
        return self._register(Histogram(name, help_text, label_names, buckets))

    def render(self, names: Iterable[str] | None = None) -> str:
        """Every metric in the Prometheus text format, sorted by name; only those named in
        ``names`` when given (a scraper that wants one family of a server with thousands of
        tablets should not pay for every family's samples)."""
        with self._lock:
            if names is None:
                chosen = list(self._metrics.values())
            else:
                chosen = [self._metrics[n] for n in set(names) if n in self._metrics]
            metrics = sorted(chosen, key=lambda m: m.name)
        lines: list[str] = []
        for metric in metrics:
            lines.extend(metric.header())
            lines.extend(metric.samples())
        return "\n".join(lines) + "\n"
