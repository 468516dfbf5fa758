"""/metrics from memory: a report's series rendered once per report, the agent's totals per scrape."""

from __future__ import annotations

import dataclasses
import gzip

import ops_synth as s
import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from agent.export.exposition import Exposition, wants_gzip
from agent.export.prometheus import make_registry

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture(autouse=True)
def steady_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    s.hold_memory(monkeypatch)


def test_the_served_body_is_what_the_collector_renders() -> None:
    st = s.state()
    body, ctype, gz = Exposition(st).render()
    assert not gz and ctype.startswith("text/plain")
    assert body == generate_latest(make_registry(st))


def test_openmetrics_keeps_one_final_eof() -> None:
    st = s.state()
    body, ctype, _ = Exposition(st).render(OPENMETRICS)
    assert ctype.startswith("application/openmetrics-text")
    assert body == generate_openmetrics(make_registry(st))
    assert body.count(b"# EOF") == 1 and body.endswith(b"# EOF\n")


def test_before_the_first_cycle_only_the_agents_totals_are_served() -> None:
    st = s.AgentState(node="node-a")
    body, _, _ = Exposition(st).render(OPENMETRICS)
    assert b"perfbalance_build_info" in body and b"perfbalance_container_" not in body
    assert body.endswith(b"# EOF\n")


def test_a_report_is_rendered_once_however_often_it_is_scraped() -> None:
    st = s.state()
    exp = Exposition(st)
    exp.prerender()
    for _ in range(5):
        exp.render()
    assert exp.renders == 1


def test_a_new_report_is_rendered_again_and_shows_its_values() -> None:
    st = s.state()
    exp = Exposition(st)
    exp.render()
    web = dataclasses.replace(s.WEB, metrics={**s.WEB.metrics, "cpu_usage_cores": 0.125})
    st.publish(s.report((s.TRAINER, web, s.DB), cycle=8))
    body, _, _ = exp.render()
    assert exp.renders == 2
    assert b"perfbalance_cycles_total 8.0" in body and b"0.125" in body


def test_the_agents_totals_change_between_reports() -> None:
    st = s.state()
    exp = Exposition(st)
    before, _, _ = exp.render()
    with st.lock:
        st.config_reloads_total["invalid"] += 1
    after, _, _ = exp.render()
    assert exp.renders == 1  # the report's part was served from memory...
    assert b'perfbalance_config_reloads_total{result="invalid"} 1.0' in after  # ...the totals were not
    assert b'result="invalid"' not in before


def test_gzip_is_served_when_asked_and_decompresses_to_the_plain_body() -> None:
    st = s.state()
    exp = Exposition(st)
    plain, _, _ = exp.render()
    packed, _, gz = exp.render("", "deflate, gzip")
    assert gz and gzip.decompress(packed) == plain  # two gzip members are one stream
    assert len(packed) < len(plain)


@pytest.mark.parametrize(("header", "want"), [("gzip", True), ("br, GZIP;q=0.5", True), ("gzip;q=0", False),
                                              ("identity", False), ("", False), ("gzip;q=bad", True)])
def test_accept_encoding_is_read_like_http_says(header: str, want: bool) -> None:
    assert wants_gzip(header) is want


def test_the_scrape_benchmark_renders_every_container_series() -> None:
    from agent.bench.scrape import measure_scrape

    out = measure_scrape(40, runs=2)
    assert out["series"] >= 40 * 20  # every counter and gauge of every container
    assert 0 < out["gzip_bytes"] < out["bytes"]
    assert out["render_ms_median"] > 0 and out["served_ms_median"] > 0
