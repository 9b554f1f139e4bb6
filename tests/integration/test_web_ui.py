"""The web UI in a real headless browser (issue 35, item 1): Debian's ``chromium``, driven by
its own command line (``--dump-dom``, ``--screenshot``), against a live cluster. Every page
type renders with the data it should show (the table's name, escaped; each tablet's leader),
every link found on any page resolves, the tablet-copy cancel action answers, and live state
is shown: a killed tablet server turns UNRESPONSIVE on the master's page. One screenshot per
page type lands in an artefact folder (``$NYALA_ARTEFACTS`` or pytest's tmp), printed.

``make setup`` installs chromium (``apt-get install -y chromium`` as root); without it these
tests skip and say why.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import nyala
from nyala.local_cluster import LocalCluster
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (make setup installs it as root: apt-get install chromium)",
)

#: A name that breaks the page unless the UI escapes it.
TABLE = "web<ui>&'events\""
CHROMIUM_TIMEOUT_S = 90
_HREF = re.compile(r'href="([^"]*)"')
_MASTER_PAGES = (
    "/",
    "/tables",
    "/tablet-servers",
    "/masters",
    "/tablet-copies",
    "/mem-trackers",
    "/logs",
    "/metrics-page",
    "/varz",
)
_TSERVER_PAGES = ("/", "/tablets", "/tablet-copies", "/mem-trackers", "/logs", "/metrics-page")


def _chromium(*args: str) -> str:
    """Runs headless chromium with ``args``; its stdout."""
    assert CHROMIUM is not None
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"nyala-chromium-{os.getpid()}"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dom(url: str, screenshot: Path | None = None) -> str:
    """The page's DOM after chromium rendered it (and its screenshot, in the same run)."""
    if screenshot is None:
        return _chromium("--dump-dom", url)
    dom = _chromium(f"--screenshot={screenshot}", "--window-size=1400,1000", "--dump-dom", url)
    assert screenshot.stat().st_size > 1000, f"empty screenshot of {url}"
    return dom


def _get(url: str) -> tuple[int, str]:
    """Status and body of ``url`` as a browser asks for it (HTML)."""
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=30) as page:
            return page.status, page.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _links(base: str, body: str) -> list[str]:
    return [urllib.parse.urljoin(base, html.unescape(h)) for h in _HREF.findall(body)]


def _crawl(starts: list[str], allowed_hosts: set[str]) -> dict[str, int]:
    """Every page reachable by links from ``starts`` on the cluster's HTTP addresses ->
    its status."""
    seen: dict[str, int] = {}
    queue = list(starts)
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        status, body = _get(url)
        seen[url] = status
        if status == 200 and "<html" in body:
            for link in _links(url, body):
                if urllib.parse.urlsplit(link).netloc in allowed_hosts and link not in seen:
                    queue.append(link)
    return seen


def _until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    root = os.environ.get("NYALA_ARTEFACTS")
    folder = Path(root) / "web-ui" if root else tmp_path / "web-ui"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nweb UI screenshots: {folder}")
    return folder


def test_web_ui_in_a_browser(artefacts: Path) -> None:
    with LocalCluster(
        1, 3, master_flags=fast_master_flags(), tserver_flags=FAST_TSERVER_FLAGS
    ) as lc:
        schema = nyala.Schema.parse("id:int64, v:double?", key=["id"])
        table = lc.client.create_table(
            TABLE, schema, partitioning=nyala.HashPartitioning("id", 2), replicas=3
        )
        assert table.insert({"id": list(range(100)), "v": [0.5] * 100}).ok
        master = f"http://{lc.mini.masters[0].http_addr}"
        tservers = [f"http://{ts.http_addr}" for ts in lc.mini.tservers]
        locations = lc.client.describe_table(TABLE)["tablets"]

        # Every link found on any page of any server resolves.
        hosts = {urllib.parse.urlsplit(u).netloc for u in [master, *tservers]}
        crawled = _crawl([f"{master}/", *(f"{t}/" for t in tservers)], hosts)
        broken = {url: status for url, status in crawled.items() if status != 200}
        assert not broken, broken
        assert len(crawled) > len(_MASTER_PAGES) + 3 * len(_TSERVER_PAGES)

        # Every page type renders in the browser, with what it must show.
        table_url = next(u for u in crawled if "/table?id=" in u)
        pages = {f"master_{_page_name(p)}": master + p for p in _MASTER_PAGES}
        pages |= {f"tserver_{_page_name(p)}": tservers[0] + p for p in _TSERVER_PAGES}
        pages["master_table"] = table_url
        tablet_url = next(u for u in crawled if "/tablet?id=" in u and u.startswith(tservers[0]))
        pages["tserver_tablet"] = tablet_url
        doms = {}
        for name, url in pages.items():
            dom = doms[name] = _dom(url, artefacts / f"{name}.png")
            assert "<h1>" in dom, (name, dom[:300])
            assert "</html>" in dom, (name, dom[-300:])
        escaped = html.escape(TABLE, quote=False)
        assert escaped in doms["master_tables"]
        assert TABLE not in doms["master_tables"]  # never as raw markup
        assert escaped in doms["master_table"]
        for tablet in locations:
            assert tablet["tablet_id"] in doms["master_table"]
        assert "LEADER" in doms["master_table"]
        assert "Committed config" in doms["tserver_tablet"]
        assert "log anchors" in doms["tserver_tablet"]
        assert "commit index" in doms["tserver_tablet"]
        assert "nyala_rows_written_total" in doms["tserver_metrics-page"]
        assert "http server listening" in doms["master_logs"]
        assert len(list(artefacts.glob("*.png"))) >= len(pages)

        # The cancel action: an unknown job is a 404 page, the form's target answers POST.
        form = urllib.parse.urlencode({"id": "no-such-job"}).encode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{tservers[0]}/tablet-copies/cancel", data=form, timeout=10)
        assert refused.value.code == 404

        # Live state: a killed tablet server is no longer LIVE on the master's page.
        victim = lc.mini.tservers[2]
        victim_uuid = victim.wait_ready()
        assert _row_state(_dom(f"{master}/tablet-servers"), victim_uuid) == "LIVE"
        victim.kill()
        _until(
            lambda: _row_state(_dom(f"{master}/tablet-servers"), victim_uuid) != "LIVE",
            timeout_s=30,
        )
        after = _dom(f"{master}/tablet-servers", artefacts / "master_tablet-servers_after_kill.png")
        assert _row_state(after, victim_uuid) != "LIVE"


def _page_name(path: str) -> str:
    return path.strip("/") or "home"


def _row_state(dom: str, uuid: str) -> str:
    """The state shown in the ``/tablet-servers`` row of ``uuid``."""
    row = next(r for r in dom.split("<tr>") if uuid in r)
    match = re.search(r'<span class="(LIVE|UNRESPONSIVE|DEAD)">', row)
    assert match, row
    return match[1]
