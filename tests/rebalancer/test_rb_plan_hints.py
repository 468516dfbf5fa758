"""`perfbalance plan` explains the placement annotations: affinity pairs now and after the plan,
AVX-512 pre-classification, each beside a snapshot without the annotation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.bench import scenarios as sc
from agent.bench.sim import snapshot

AVX = "perfbalance.io/avx512"


def saved(tmp_path: Path, s: sc.Scenario, *, drop: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> Path:
    """`s` at its initial placement as a saved snapshot; `drop`: metrics removed from every container."""
    doc = snapshot(s.node, s.workloads, s.initial, time=5000.0).to_json()
    for c in doc["containers"]:
        c["metrics"] = {k: v for k, v in c["metrics"].items() if k not in drop}
    path = tmp_path / f"{s.name}.json"
    path.write_text(json.dumps({**doc, **(extra or {})}))
    return path


def strip(s: sc.Scenario, hard_only: bool = False) -> sc.Scenario:
    return replace(s, workloads=tuple(replace(w, annotations={k: v.replace("!", "") for k, v in w.annotations.items()}
                                              if hard_only else {}) for w in s.workloads))


def hints(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["plan", "--json", str(path)]) == 0
    return json.loads(capsys.readouterr().out)["hints"]  # type: ignore[no-any-return]


def pair(h: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    return next(p for p in h["pairs"] if (p["container"], p["other"]) == (a, b))


def test_an_anti_affine_pair_is_explained_now_and_after_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = pair(hints(saved(tmp_path, sc.anti_affinity()), capsys), "stream-0", "stream-1")
    assert (p["who"], p["other_who"], p["scope"], p["weight"], p["hard"]) == \
        ("prod/stream-0/main", "prod/stream-1/main", "numa", 0.5, False)
    assert (p["overlap_now"], p["satisfied_now"], p["term_now"]) == (1.0, False, 0.5)
    assert (p["overlap_after"], p["satisfied_after"], p["term_after"]) == (0.0, True, 0.0)


def test_without_annotations_there_are_no_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hints(saved(tmp_path, strip(sc.anti_affinity())), capsys) == {"pairs": [], "avx512": [], "problems": []}


def test_an_affine_pair_earns_its_term_after_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = pair(hints(saved(tmp_path, sc.affinity()), capsys), "consumer", "producer")
    assert (p["kind"], p["satisfied_now"], p["term_now"]) == ("affinity", False, 0.0)
    assert (p["satisfied_after"], p["term_after"]) == (True, -0.3)


@pytest.mark.parametrize("hard", [True, False])
def test_the_hard_pair_stays_satisfied_and_its_blocker_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 hard: bool) -> None:
    s = sc.hard_anti_affinity()
    h = hints(saved(tmp_path, s if hard else strip(s, hard_only=True)), capsys)
    kv, web = pair(h, "kv-0", "kv-1"), pair(h, "kv-1", "web")
    assert kv["hard"] is hard and kv["satisfied_now"]
    assert kv["satisfied_after"] is hard and web["satisfied_after"] is not hard  # soft: the affinity wins


def test_the_text_output_has_a_line_per_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(saved(tmp_path, sc.hard_anti_affinity()))]) == 0
    out = capsys.readouterr().out
    assert "- hard anti-affinity prod/kv-0/main / prod/kv-1/main (app=kv@numa!; numa, hard): now they share 0%" in out
    assert "constraint: hard anti-affinity kv-0 / kv-1" in out  # the candidate it blocked
    assert "- affinity prod/kv-1/main / prod/web/main (app=web@numa*0.5; numa, weight 0.5)" in out
    assert "overlap" not in out.split("considered and not done:")[1].split("affinity and anti-affinity")[0]


def annotated_avx(annotate: str) -> sc.Scenario:
    s = sc.avx512_small()
    return replace(s, workloads=tuple(replace(w, annotations={AVX: "true"}) if w.id == annotate else w
                                      for w in s.workloads))


@pytest.mark.parametrize("annotate, drop, state", [
    ("avx-0", (), "confirmed"),  # measured 512-bit use agrees
    ("web-0", (), "preclassified"),  # measured scalar, but one window does not overrule it yet
    ("web-0", ("avx512_heavy", "avx512_active_ratio"), "unmeasured"),
])
def test_avx512_annotation_state(tmp_path: Path, capsys: pytest.CaptureFixture[str], annotate: str,
                                 drop: tuple[str, ...], state: str) -> None:
    (n,) = hints(saved(tmp_path, annotated_avx(annotate), drop=drop), capsys)["avx512"]
    assert (n["container"], n["who"], n["state"], n["heavy"]) == (annotate, annotate, state, True)


def test_unannotated_avx512_work_has_no_preclassification(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hints(saved(tmp_path, sc.avx512_small()), capsys)["avx512"] == []


def test_the_running_agents_verdict_is_shown_from_a_run_json_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    verdict = {"kind": "avx512_annotation", "container": "web-0", "heavy": False, "state": "overruled",
               "reason": "annotation overruled: no 512-bit execution measured"}
    path = saved(tmp_path, annotated_avx("web-0"), extra={"cycle": 7, "considered": [verdict, "junk"]})
    (n,) = hints(path, capsys)["avx512"]
    assert n["state"] == "preclassified" and n["recorded"] == {"state": "overruled", "reason": verdict["reason"], "cycle": 7}
    assert main(["plan", str(path)]) == 0
    assert "running agent at cycle 7: overruled (annotation overruled" in capsys.readouterr().out
    (plain,) = hints(saved(tmp_path, annotated_avx("web-0")), capsys)["avx512"]
    assert "recorded" not in plain


@pytest.mark.parametrize("value, ignored", [("app=stream@rack", True), ("app=stream@numa*0.5", False)])
def test_an_annotation_that_does_not_parse_is_named_not_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  value: str, ignored: bool) -> None:
    s = sc.anti_affinity()
    s = replace(s, workloads=tuple(replace(w, annotations={sc.ANTI: value}) if w.id == "stream-0" else
                                   replace(w, annotations={}) for w in s.workloads))
    h = hints(saved(tmp_path, s), capsys)
    assert bool(h["problems"]) is ignored and bool(h["pairs"]) is not ignored
    if ignored:
        (line,) = h["problems"]
        assert "pod prod/stream-0 container main: annotation perfbalance.io/anti-affinity='app=stream@rack'" in line
        assert main(["plan", str(saved(tmp_path, s))]) == 0
        assert "placement annotations ignored:\n- pod prod/stream-0" in capsys.readouterr().out
