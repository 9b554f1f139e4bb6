"""The web UI every server serves at ``/`` of its HTTP address (Kudu's embedded webserver):
plain server-rendered HTML with a small inline stylesheet, no JavaScript, nothing fetched from
outside the machine.

This module owns what masters and tablet servers share: the page frame and its navigation,
the HTML building blocks (every value from data is escaped: ``Cell`` text is escaped when the
page is built, only ``Markup`` made by this module's helpers passes as HTML), the in-memory
ring of recent log records, and the pages every server has (home, ``/varz``,
``/mem-trackers``, ``/logs``, ``/metrics-page``). The master's and the tablet server's own
pages live next to their servers and use these blocks; this module knows neither.

Pages that also exist as JSON (``/tablets``, ``/tables``, ...) answer JSON to a client that
does not ask for HTML (scripts, ``curl``, ``urllib``) and HTML to a browser; ``?format=json``
and ``?format=html`` choose explicitly.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from nyala.rpc.http import HttpRequest, HttpResponse

#: Log records kept in memory for ``/logs``.
log_ring_records_max = 2_000
#: Log records ``/logs`` shows by default (``?lines=N`` up to the ring's size).
log_page_lines_default = 500

_STYLE = """
body{font-family:sans-serif;margin:0;color:#222}
nav{background:#234;padding:.5em 1em}
nav a{color:#fff;margin-right:1.2em;text-decoration:none}
nav .who{color:#9bd;float:right}
main{padding:0 1em 2em}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left;vertical-align:top}
th{background:#eef}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font-family:monospace;font-size:90%}
pre.log{background:#f6f6f6;padding:.5em;overflow-x:auto}
.LEADER,.LIVE,.HEALTHY,.RUNNING,.SUCCEEDED{color:#070;font-weight:bold}
.UNRESPONSIVE,.UNKNOWN,.WARNING{color:#a60;font-weight:bold}
.DEAD,.FAILED,.FAILED_UNRECOVERABLE,.ERROR,.CRITICAL,.CANCELLED{color:#b00;font-weight:bold}
"""


@dataclass(frozen=True)
class Markup:
    """HTML that is safe as it stands (built by this module's helpers from escaped parts)."""

    html: str


Cell = str | int | float | Markup | None


def escape(value: object) -> str:
    """``value`` as text safe inside HTML (quotes too: it may land in an attribute)."""
    return html.escape(str(value), quote=True)


def cell(value: Cell) -> str:
    """One value as HTML: ``Markup`` as is, anything else escaped (None: empty)."""
    if isinstance(value, Markup):
        return value.html
    return "" if value is None else escape(value)


def link(path: str, text: Cell, **query: str) -> Markup:
    """A link to ``path`` with ``query`` parameters, both escaped."""
    href = path
    if query:
        href += "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
    return Markup(f'<a href="{escape(href)}">{cell(text)}</a>')


def state(name: str) -> Markup:
    """A state name (LEADER, LIVE, FAILED, ...) coloured by the stylesheet's class of it."""
    return Markup(f'<span class="{escape(name)}">{escape(name)}</span>')


def code(text: Cell) -> Markup:
    """``text`` in a monospace span (ids, addresses)."""
    return Markup(f"<code>{cell(text)}</code>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], *, caption: str = "") -> Markup:
    """An HTML table; numbers are right-aligned."""
    out = ["<table>"]
    if caption:
        out.append(f"<caption>{escape(caption)}</caption>")
    if headers:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        tds = (
            f'<td class="num">{cell(v)}</td>'
            if isinstance(v, int | float) and not isinstance(v, bool)
            else f"<td>{cell(v)}</td>"
            for v in row
        )
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table>")
    return Markup("".join(out))


def key_values(pairs: Iterable[tuple[str, Cell]]) -> Markup:
    """A two-column table of names and values (no header row)."""
    return table((), pairs)


def heading(text: str, level: int = 2) -> Markup:
    """An ``<hN>`` heading."""
    return Markup(f"<h{level}>{escape(text)}</h{level}>")


def paragraph(*parts: Cell) -> Markup:
    """A paragraph of text and markup."""
    return Markup("<p>" + "".join(cell(p) for p in parts) + "</p>")


def form_button(action: str, label: str, fields: dict[str, str]) -> Markup:
    """A POST form with hidden ``fields`` and one submit button (an action on the server)."""
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
    )
    return Markup(
        f'<form method="post" action="{escape(action)}">{hidden}'
        f'<button type="submit">{escape(label)}</button></form>'
    )


def human_bytes(n: float) -> str:
    """``n`` bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def wants_json(request: HttpRequest) -> bool:
    """Whether a page that exists as JSON and HTML should answer JSON: ``?format=`` decides,
    else whether the client accepts HTML (browsers do; scripts and ``curl`` do not ask)."""
    chosen = request.param("format")
    if chosen in ("json", "html"):
        return chosen == "json"
    return "text/html" not in request.headers.get("accept", "")


@dataclass(frozen=True)
class ServerIdentity:
    """Who serves the pages: shown in every page's navigation bar and on the home page."""

    role: str  # "master" or "tserver"
    uuid: str
    rpc_addr: str
    http_addr: str


class PageFrame:
    """Wraps page bodies in the shared frame: title, stylesheet, the role's navigation."""

    def __init__(self, identity: ServerIdentity, nav: Sequence[tuple[str, str]]) -> None:
        self.identity = identity
        self.nav = tuple(nav)

    def render(self, title: str, *parts: Markup, status: int = 200) -> HttpResponse:
        """The full HTML page."""
        who = self.identity
        links = "".join(f'<a href="{escape(path)}">{escape(label)}</a>' for path, label in self.nav)
        body = "".join(p.html for p in parts)
        page = (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)} · nyala {escape(who.role)} {escape(who.rpc_addr)}</title>"
            f"<style>{_STYLE}</style></head><body>"
            f'<nav>{links}<span class="who">{escape(who.role)} {escape(who.rpc_addr)}</span></nav>'
            f"<main><h1>{escape(title)}</h1>{body}</main></body></html>"
        )
        return HttpResponse(status, page.encode(), "text/html; charset=utf-8")

    def not_found(self, what: str) -> HttpResponse:
        """A 404 page in the frame."""
        return self.render("Not found", paragraph(what), status=404)


#: The pages of every server, for the navigation bar (each role adds its own before them).
COMMON_NAV: tuple[tuple[str, str], ...] = (
    ("/mem-trackers", "Memory"),
    ("/logs", "Logs"),
    ("/metrics-page", "Metrics"),
    ("/varz", "Flags"),
)


# --- the log ring ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One log record as ``/logs`` shows it."""

    created_s: float
    level: str
    logger: str
    message: str


class LogRing(logging.Handler):
    """Keeps the last ``capacity`` log records of the process in memory (bounded: a deque)."""

    def __init__(self, capacity: int = log_ring_records_max) -> None:
        super().__init__(level=logging.DEBUG)
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._lines_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        except Exception:  # a badly formatted record must not break logging
            message = str(record.msg)
        line = LogLine(record.created, record.levelname, record.name, message)
        with self._lines_lock:
            self._lines.append(line)

    def lines(self, count: int) -> list[LogLine]:
        """The newest ``count`` records, oldest first."""
        with self._lines_lock:
            lines = list(self._lines)
        return lines[-count:] if count > 0 else []


# --- the pages every server has --------------------------------------------------------------


def home_section(identity: ServerIdentity, version: str, uptime_s: float) -> Markup:
    """The home page's identity table."""
    return key_values(
        [
            ("role", identity.role),
            ("uuid", code(identity.uuid)),
            ("version", version),
            ("uptime", f"{uptime_s:.0f} s"),
            ("RPC address", code(identity.rpc_addr)),
            ("HTTP address", code(identity.http_addr)),
        ]
    )


def settings_rows(settings: object, *, changed_only: bool) -> list[tuple[Cell, ...]]:
    """(name, value, default) of each field of a settings dataclass (``changed_only``: those
    that differ from their default)."""
    assert dataclasses.is_dataclass(settings)
    rows: list[tuple[Cell, ...]] = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.default is not dataclasses.MISSING:
            default: object = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None  # required: no default to show
        if changed_only and value == default:
            continue
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        shown_default = "" if default is None else default
        if isinstance(shown_default, tuple):
            shown_default = ",".join(map(str, shown_default))
        rows.append((code(f.name), str(shown), str(shown_default)))
    return rows


def logs_section(ring: LogRing, count: int) -> Markup:
    """The newest ``count`` log records, escaped, one per line."""
    out = []
    for line in ring.lines(count):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(line.created_s))
        millis = int((line.created_s % 1) * 1000)
        out.append(
            f"{when}.{millis:03d}Z {state(line.level).html} {escape(line.logger)}: "
            f"{escape(line.message)}"
        )
    return Markup('<pre class="log">' + "\n".join(out) + "</pre>")


def metrics_section(text: str) -> Markup:
    """The Prometheus text of ``/metrics`` as one table per family (histogram buckets left
    out: their sum and count stay)."""
    families: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            families[name] = (help_text, [])
            current = name
        elif line and not line.startswith("#") and current:
            series, _, value = line.rpartition(" ")
            if "_bucket{" in series:
                continue
            families[current][1].append((series, value))
    parts = [
        paragraph(
            "The same values for Prometheus: ", link("/metrics", "/metrics"), " (text format)."
        )
    ]
    rows: list[tuple[Cell, ...]] = []
    for name, (help_text, samples) in families.items():
        for series, value in samples or [("", "")]:
            labels = series[len(name) :] if series.startswith(name) else series
            rows.append((code(name), labels, value, help_text))
    parts.append(table(("metric", "labels", "value", "help"), rows))
    return Markup("".join(p.html for p in parts))
