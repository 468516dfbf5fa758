"""The `/metrics` body, rendered once per cycle and served from memory.

Why: at 1000 containers a report is about ten thousand series, and rendering them is what a
scrape cost (about 180 ms of the HTTP thread's CPU on a 2-CPU VM, per scrape and per scraper).
The series a report determines change once per cycle, so they are rendered once per report (and
once per format a scraper asks for: Prometheus text, OpenMetrics, each optionally gzipped) and
kept as bytes; only the agent's own totals (MQTT counters, reloads, readiness: a few dozen series
that change between cycles) are rendered per scrape and put in front. A scrape never walks the
containers of a report that was already rendered.

The loop renders a new report in its worker thread right after publishing it (`prerender`), so
the first scrape after a cycle is as cheap as the others; a report that was not prerendered (a
test publishing straight into AgentState) is rendered by the first scrape that sees it.
Concatenating the two parts is valid: families are disjoint, an OpenMetrics body keeps one final
`# EOF`, and a gzip body of two members is one valid gzip stream (RFC 1952, section 2.2).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from agent.export.prometheus import live_families, report_families
from agent.export.report import AgentState, CycleReport

EOF_LINE = b"# EOF\n"
MAX_VARIANTS = 8  # formats x encodings kept per report (Accept headers are few in practice)
GZIP_LEVEL = 6


class _Families(Collector):
    """A collector over families already computed (what an encoder takes)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _encode(encoder: Callable[[Collector], bytes], families: Iterable[Metric], *, final: bool) -> bytes:
    body = encoder(_Families(families))
    if not final and body.endswith(EOF_LINE):  # OpenMetrics: only the last part ends the body
        body = body[: -len(EOF_LINE)]
    return body


def wants_gzip(accept_encoding: str) -> bool:
    """True when the client accepts gzip (`q=0` refuses it)."""
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() == "gzip":
            q = params.strip().lower()
            return not (q.startswith("q=") and _q(q[2:]) == 0.0)
    return False


def _q(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 1.0


class Exposition:
    """The rendered report part of the current report, per (format, gzip), and the live part."""

    def __init__(self, state: AgentState, *, bandwidth_peak: float = 0.0) -> None:
        self.state, self.bandwidth_peak = state, bandwidth_peak
        self._lock = threading.Lock()  # one renderer per report; scrapes wait for it, not redo it
        self._report: CycleReport | None = None
        self._bodies: dict[tuple[str, bool], bytes] = {}
        self.renders = 0  # report renders done (tests and `bench collect` read it)

    def render(self, accept: str = "", accept_encoding: str = "") -> tuple[bytes, str, bool]:
        """(body, content type, gzipped) for one scrape."""
        encoder, ctype = choose_encoder(accept)
        gz = wants_gzip(accept_encoding)
        view = self.state.view()
        report: CycleReport | None = view["latest"]
        live = _encode(encoder, live_families(view), final=report is None)
        if gz:
            live = gzip.compress(live, GZIP_LEVEL, mtime=0)
        if report is None:
            return live, ctype, gz
        return live + self._report_body(report, view, encoder, ctype, gz), ctype, gz

    def prerender(self) -> None:
        """Render the latest report in the default text format (the loop calls this per cycle)."""
        view = self.state.view()
        report = view["latest"]
        if report is not None:
            encoder, ctype = choose_encoder("")
            self._report_body(report, view, encoder, ctype, False)

    def _report_body(self, report: CycleReport, view: Mapping[str, Any], encoder: Callable[[Collector], bytes],
                     ctype: str, gz: bool) -> bytes:
        with self._lock:
            if report is not self._report:
                self._report, self._bodies = report, {}
            return self._body(report, view, encoder, ctype, gz)

    def _body(self, report: CycleReport, view: Mapping[str, Any], encoder: Callable[[Collector], bytes],
              ctype: str, gz: bool) -> bytes:
        """The report part in one variant, from the cache or made (a gzip one from the plain one)."""
        body = self._bodies.get((ctype, gz))
        if body is not None:
            return body
        if gz:
            body = gzip.compress(self._body(report, view, encoder, ctype, False), GZIP_LEVEL, mtime=0)
        else:
            self.renders += 1
            body = _encode(encoder, report_families(report, view, bandwidth_peak=self.bandwidth_peak), final=True)
        if len(self._bodies) < MAX_VARIANTS:
            self._bodies[(ctype, gz)] = body
        return body
