"""The metrics registry counts, and renders valid Prometheus text."""

from __future__ import annotations

import re
import threading

import pytest

from nyala.common.metrics import MetricsRegistry


def test_counter_with_labels_and_rendering() -> None:
    registry = MetricsRegistry()
    requests = registry.counter("rpc_total", "RPCs", ("method", "code"))
    requests.inc(method="Ping", code="OK")
    requests.inc(2, method="Ping", code="OK")
    requests.inc(method="Write", code='we"ird\n')
    assert requests.value(method="Ping", code="OK") == 3
    assert requests.value(method="Scan", code="OK") == 0
    text = registry.render()
    assert "# TYPE rpc_total counter\n" in text
    assert 'rpc_total{method="Ping",code="OK"} 3\n' in text
    assert 'rpc_total{method="Write",code="we\\"ird\\n"} 1\n' in text


def test_counter_refuses_to_go_down_and_wrong_labels() -> None:
    counter = MetricsRegistry().counter("c", "c", ("a",))
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc(-1, a="x")
    with pytest.raises(ValueError, match="labels"):
        counter.inc(b="x")
    with pytest.raises(ValueError, match="labels"):
        counter.inc()


def test_gauge_set_inc_remove_and_callback() -> None:
    registry = MetricsRegistry()
    role = registry.gauge("role", "role", ("tablet",))
    role.set(1, tablet="t1")
    role.inc(2, tablet="t1")
    role.set(0.5, tablet="t2")
    role.remove(tablet="t2")
    assert role.value(tablet="t1") == 3
    assert 'role{tablet="t1"} 3\n' in registry.render()
    assert "t2" not in registry.render()
    live = registry.gauge("live", "live", ("state",))
    live.set_callback(lambda: [({"state": "RUNNING"}, 2.0)])
    assert 'live{state="RUNNING"} 2\n' in registry.render()


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    registry = MetricsRegistry()
    latency = registry.histogram("lat_seconds", "latency", ("m",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        latency.observe(value, m="Ping")
    text = registry.render()
    assert 'lat_seconds_bucket{m="Ping",le="0.1"} 2\n' in text  # le is inclusive
    assert 'lat_seconds_bucket{m="Ping",le="1"} 3\n' in text
    assert 'lat_seconds_bucket{m="Ping",le="+Inf"} 4\n' in text
    assert 'lat_seconds_count{m="Ping"} 4\n' in text
    assert 'lat_seconds_sum{m="Ping"} 3.65\n' in text
    assert latency.count(m="Ping") == 4


def test_histogram_refuses_unsorted_buckets() -> None:
    with pytest.raises(ValueError, match="increasing"):
        MetricsRegistry().histogram("h", "h", buckets=(1.0, 0.5))


def test_names_are_unique() -> None:
    registry = MetricsRegistry()
    registry.counter("x", "x")
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("x", "x")


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="([^"\\]|\\.)*",?)*\})? \S+$')


def test_every_rendered_line_is_well_formed() -> None:
    registry = MetricsRegistry()
    registry.counter("a_total", "a", ("k",)).inc(k="v")
    registry.gauge("b", "b").set(-1.5)
    registry.histogram("c_seconds", "c", ("m", "n")).observe(0.2, m="x", n="y")
    for line in registry.render().splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \w+ .+$", line), line
        else:
            assert _SAMPLE.match(line), line


def test_concurrent_increments_are_not_lost() -> None:
    counter = MetricsRegistry().counter("n_total", "n")

    def work() -> None:
        for _ in range(10_000):
            counter.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.value() == 40_000


def test_render_only_the_named_families() -> None:
    """``/metrics?metrics=a,b``: the named families only; a callback of another family is not
    even called (that is what a scraper of one family saves on a server of many tablets)."""
    registry = MetricsRegistry()
    registry.counter("wanted_total", "w").inc()
    calls = []
    costly = registry.gauge("costly", "c", ("tablet",))
    costly.set_callback(lambda: calls.append(1) or [({"tablet": "t1"}, 1.0)])
    text = registry.render(["wanted_total", "no_such_metric"])
    assert text == "# HELP wanted_total w\n# TYPE wanted_total counter\nwanted_total 1\n"
    assert calls == []
    assert 'costly{tablet="t1"} 1' in registry.render()
    assert calls == [1]
