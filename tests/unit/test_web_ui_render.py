"""The web UI's building blocks (``nyala.server.web_ui``): data is escaped wherever it lands,
JSON and HTML are chosen as documented, the log ring is bounded, the metrics page reads the
Prometheus text. The pages themselves are tested in a browser (tests/integration/test_web_ui.py).
"""

from __future__ import annotations

import logging

from nyala.common.metrics import MetricsRegistry
from nyala.rpc.http import HttpRequest
from nyala.server.web_ui import (
    LogRing,
    PageFrame,
    ServerIdentity,
    code,
    form_button,
    link,
    logs_section,
    metrics_section,
    table,
    wants_json,
)

EVIL = "<script>alert('x')</script>&\""


def test_every_value_from_data_is_escaped() -> None:
    rendered = table(("name", "n"), [(EVIL, 3), (code(EVIL), link("/t", EVIL, id=EVIL))]).html
    assert "<script>" not in rendered
    assert rendered.count("&lt;script&gt;") == 3
    assert "id=%3Cscript%3E" in rendered  # the query value is URL-encoded, then escaped
    assert '<td class="num">3</td>' in rendered
    button = form_button("/tablet-copies/cancel", "Cancel", {"id": EVIL}).html
    assert 'value="&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;"' in button
    frame = PageFrame(ServerIdentity("tserver", "u", "h:1", "h:2"), [("/", "Home")])
    page = frame.render(EVIL).body.decode()
    assert "<script>" not in page
    assert "<title>&lt;script&gt;" in page


def test_json_for_scripts_html_for_browsers() -> None:
    browser = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    assert wants_json(HttpRequest("GET", "/tablets"))
    assert wants_json(HttpRequest("GET", "/tablets", headers={"accept": "*/*"}))
    assert not wants_json(HttpRequest("GET", "/tablets", headers=browser))
    assert wants_json(HttpRequest("GET", "/tablets", {"format": ["json"]}, headers=browser))
    assert not wants_json(HttpRequest("GET", "/tablets", {"format": ["html"]}))


def test_the_log_ring_keeps_the_newest_records_escaped() -> None:
    ring = LogRing(capacity=3)
    logger = logging.getLogger("nyala.test_web_ui")
    logger.addHandler(ring)
    logger.setLevel(logging.INFO)
    try:
        for i in range(5):
            logger.info("record %d %s", i, EVIL)
    finally:
        logger.removeHandler(ring)
    lines = ring.lines(10)
    assert [line.message.split()[1] for line in lines] == ["2", "3", "4"]
    assert len(ring.lines(2)) == 2
    shown = logs_section(ring, 3).html
    assert "<script>" not in shown
    assert "record 4 &lt;script&gt;" in shown


def test_the_metrics_page_lists_every_family() -> None:
    registry = MetricsRegistry()
    registry.counter("nyala_x_total", "X things", ("table",)).inc(2, table=EVIL)
    registry.histogram("nyala_y_seconds", "Y time").observe(0.01)
    shown = metrics_section(registry.render()).html
    assert "nyala_x_total" in shown
    assert "&lt;script&gt;" in shown
    assert "<script>" not in shown
    assert "nyala_y_seconds" in shown
    assert "_bucket" not in shown  # buckets left out, sum and count kept
    assert "_count" in shown
    assert 'href="/metrics"' in shown
