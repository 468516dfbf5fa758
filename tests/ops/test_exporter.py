"""The Prometheus collector: what a scrape shows for a synthetic report."""

from __future__ import annotations

import dataclasses
import json
import re

import ops_synth as s
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import Config
from agent.export import selfmem
from agent.export.mqtt import MqttPublisher
from agent.export.prometheus import MAX_LABEL_CHARS, MAX_REASONS, make_registry, state_json
from agent.export.report import AgentState, reason_code
from agent.loop import Agent
from agent.snapshot.derive import derive
from perfbalance.model import ContainerSample
from resctrl.metrics import ClassUsage, ResctrlMetrics

WEB_ID = {"namespace": "web", "pod": "frontend-7d9f", "container": "nginx"}


def scrape(state: AgentState, **kw: float) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """family name -> [(sample name, labels, value)] as Prometheus would parse it."""
    text = generate_latest(make_registry(state, **kw)).decode()
    return {f.name: [(x.name, x.labels, x.value) for x in f.samples]
            for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels: str) -> float:
    for family in fams.values():
        for sample, lab, v in family:
            if sample == name and all(lab.get(k) == x for k, x in labels.items()):
                return v
    raise KeyError(f"{name} {labels}")


def test_container_counters_come_from_cumulative_metrics() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_container_cpu_seconds_total", **WEB_ID) == 300.25
    assert value(fams, "perfbalance_container_memory_bandwidth_bytes_total", container="pg") == 7.5e13


def test_container_series_carry_namespace_pod_container_only() -> None:
    fams = scrape(s.state())
    for name, samples in fams.items():
        if name.startswith("perfbalance_container_") and name != "perfbalance_container_info":
            for _, labels, _ in samples:
                assert set(labels) == {"namespace", "pod", "container"}, name


def test_info_metric_carries_rdt_class_and_cpuset() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_container_info", container="pg", **{"class": "lc", "cpuset": "2-3,6-7"}) == 1


def test_departed_container_series_disappear() -> None:
    st = s.state()
    assert any(l.get("container") == "nginx" for _, l, _ in scrape(st)["perfbalance_container_cpu_seconds"])
    st.publish(s.report((s.TRAINER, s.DB), cycle=8, with_move=False))
    fams = scrape(st)
    assert not any(l.get("container") == "nginx" for f in fams.values() for _, l, _ in f)


def test_scrape_leaves_counters_and_state_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    s.hold_memory(monkeypatch)
    st = s.state()
    first, second = scrape(st), scrape(st)
    assert first == second
    assert st.moves_total[("cpuset", reason_code(s.MOVE_REASON))] == 1


def test_ipc_and_mpki_are_the_snapshots_derived_values() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_container_ipc", **WEB_ID) == s.WEB.metrics["ipc"]
    assert value(fams, "perfbalance_container_llc_mpki", **WEB_ID) == s.WEB.metrics["llc_mpki"]
    assert value(fams, "perfbalance_container_memory_bandwidth_estimated", **WEB_ID) == 1.0


def test_the_exporter_derives_nothing_itself() -> None:
    raw = ContainerSample(container=s.WEB.container, metrics=s.WEB_MEASURED)  # not through derive()
    fams = scrape(s.state(s.report((raw,), with_move=False)))
    for name in ("ipc", "llc_mpki", "memory_bandwidth_bytes_per_second", "memory_bandwidth_bytes_per_instruction"):
        assert fams[f"perfbalance_container_{name}"] == [], name


def test_run_queue_latency_is_exported_where_the_collector_measured_it() -> None:
    fams = {f.name: f for f in text_string_to_metric_families(full_exposition())}
    p99 = fams["perfbalance_container_runqueue_latency_p99_seconds"]
    assert [(x.labels["container"], x.value) for x in p99.samples] == [("pg", 4e-3)]  # the others have none
    wait = fams["perfbalance_container_runqueue_wait_seconds_per_second"]
    assert [x.value for x in wait.samples] == [0.03]


def test_bytes_per_instruction_is_bandwidth_over_instructions_where_both_exist() -> None:
    fams = scrape(s.state())
    web = s.WEB.metrics
    assert value(fams, "perfbalance_container_memory_bandwidth_bytes_per_instruction", **WEB_ID) \
        == web["memory_bandwidth_bytes_per_second"] / web["instructions_per_second"]
    others = {l["container"] for _, l, _ in fams["perfbalance_container_memory_bandwidth_bytes_per_instruction"]}
    assert others == {"nginx"}  # train and pg have bandwidth but no instruction rate


def test_no_bytes_per_instruction_without_instructions() -> None:
    idle = ContainerSample(container=s.WEB.container, metrics=derive({**s.WEB_MEASURED, "instructions_per_second": 0.0}))
    fams = scrape(s.state(s.report((idle,), with_move=False)))
    assert fams["perfbalance_container_memory_bandwidth_bytes_per_instruction"] == []


def test_smt_sibling_of_avx512_heavy_neighbour_is_contaminated() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_container_avx512_contamination_ratio", **WEB_ID) == 1.0
    assert value(fams, "perfbalance_container_avx512_contamination_ratio", container="pg") == 0.0
    assert value(fams, "perfbalance_cpu_avx512_heavy_core", cpu="5") == 1.0


def test_contamination_is_derived_once_when_the_report_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.export.report as report_module
    calls = []
    real = report_module.avx512_contamination
    monkeypatch.setattr(report_module, "avx512_contamination", lambda snap: calls.append(snap) or real(snap))
    st = s.state()
    assert len(calls) == 1
    fams = scrape(st)
    doc = state_json(st.view())
    assert len(calls) == 1  # scrapes and /api/state read the report's contamination
    assert value(fams, "perfbalance_container_avx512_contamination_ratio", **WEB_ID) \
        == {c["id"]: c["contamination"] for c in doc["view"]["containers"]}["c-web"] == 1.0


def test_decision_carries_predicted_and_realized_numbers() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_decision_predicted_benefit_cores", **WEB_ID) == 0.35
    assert value(fams, "perfbalance_decision_predicted_cost_cores", **WEB_ID) == 0.05
    assert value(fams, "perfbalance_decision_realized_gain_cores", **WEB_ID) == 0.27


def test_moves_are_counted_by_kind_and_reason_code() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_rebalance_moves_total", kind="cpuset", reason="avx512_isolation") == 1


def test_reason_label_values_are_bounded() -> None:
    st = s.state()
    for i in range(MAX_REASONS * 3):
        st.moves_total[("cpuset", reason_code(f"reason number {i}: detail"))] += 1
    reasons = {l["reason"] for _, l, _ in scrape(st)["perfbalance_rebalance_moves"]}
    assert len(reasons) <= MAX_REASONS + 1 and "other" in reasons


def test_the_moves_metric_and_the_mqtt_event_give_a_move_the_same_reason_code() -> None:
    agent = Agent(Config(), node="node-a")
    move = dataclasses.replace(s.MOVE, reason="AVX-512 shield: clear scalar work off the SMT siblings of 0-1")
    agent._count(move)
    (labels,) = [l for _, l, _ in scrape(agent.state)["perfbalance_rebalance_moves"] if l["kind"] == "cpuset"]
    pub = MqttPublisher(Config().mqtt, "node-a", agent.state)
    event = pub.event(s.applied(move), None, {"id": move.container})
    assert labels["reason"] == event["reason_code"] == reason_code(move.reason)


def test_reason_code_is_the_snake_case_head() -> None:
    assert reason_code("AVX-512 isolation (core 3): x") == "avx_512_isolation"
    assert reason_code("   ") == "unspecified"


def test_label_values_are_sanitized_and_bounded() -> None:
    odd = dataclasses.replace(s.WEB.container, name="a\nb\x00" + "x" * 500)
    st = s.state(s.report((ContainerSample(container=odd, metrics=s.WEB.metrics),), with_move=False))
    names = {l["container"] for _, l, _ in scrape(st)["perfbalance_container_cpu_seconds"]}
    (name,) = names
    assert len(name) <= MAX_LABEL_CHARS and "\n" not in name and "\x00" not in name


def test_containers_with_the_same_labels_give_one_series() -> None:
    twin = ContainerSample(container=dataclasses.replace(s.WEB.container, id="c-web-restarted"),
                           metrics=s.WEB.metrics)
    st = s.state(s.report((s.WEB, twin), with_move=False))
    assert len(scrape(st)["perfbalance_container_cpu_seconds"]) == 1


def test_no_series_crosses_cpu_and_container() -> None:
    for samples in scrape(s.state()).values():
        for _, labels, _ in samples:
            assert not ({"cpu", "container"} <= set(labels))


def test_names_follow_prometheus_conventions() -> None:
    text = generate_latest(make_registry(s.state(), bandwidth_peak=2e10)).decode()
    for family in text_string_to_metric_families(text):
        assert re.fullmatch(r"perfbalance_[a-z0-9_]+", family.name)
        if family.type == "counter":
            assert all(x.name.endswith(("_total", "_created")) for x in family.samples)
        else:
            assert not family.name.endswith("_total"), family.name
        assert not re.search(r"_(ms|milliseconds|kb|mb|percent)(_|$)", family.name)


def test_build_info_is_exported_before_the_first_cycle() -> None:
    fams = scrape(AgentState(node="n"))
    assert value(fams, "perfbalance_build_info") == 1
    assert value(fams, "perfbalance_ready") == 0
    assert "perfbalance_container_cpu_seconds" not in fams


def test_saturation_is_exported_only_when_the_peak_is_known() -> None:
    assert scrape(s.state())["perfbalance_memory_bandwidth_saturation_ratio"] == []
    fams = scrape(s.state(), bandwidth_peak=2e10)
    assert value(fams, "perfbalance_memory_bandwidth_saturation_ratio", domain="0") == (1e9 + 2.56e8 + 9e9) / 2e10


def test_resctrl_budget_prefers_agent_state_over_node_metrics() -> None:
    st = s.state()
    st.extra["resctrl_closids_free"] = 1
    fams = scrape(st)
    assert value(fams, "perfbalance_resctrl_closids_free") == 1
    assert value(fams, "perfbalance_resctrl_rmids_free") == 200


def test_resctrl_budget_comes_from_the_snapshot_the_resctrl_collector_fills() -> None:
    budget = ResctrlMetrics(num_closids=16, free_closids=3, num_rmids=256, free_rmids=40).node_metrics()
    rep = dataclasses.replace(s.report(), snapshot=s.snapshot(node_metrics=budget))
    fams = scrape(s.state(rep))
    assert value(fams, "perfbalance_resctrl_closids_free") == 3
    assert value(fams, "perfbalance_resctrl_closids") == 16
    assert value(fams, "perfbalance_resctrl_rmids_free") == 40
    assert value(fams, "perfbalance_resctrl_rmids") == 256


def test_collector_up_follows_the_snapshot() -> None:
    fams = scrape(s.state())
    assert value(fams, "perfbalance_collector_up", collector="cgroup") == 1
    assert value(fams, "perfbalance_collector_up", collector="pmu") == 0


def test_state_json_is_strict_json_with_the_report_and_the_view() -> None:
    st = s.state()
    st.realized.append(dataclasses.replace(st.realized[0], event_id="ev-x", realized=float("nan")))
    doc = state_json(st.view())
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text)["report"]["cycle"] == 7
    assert doc["view"]["decisions"][0]["reason"] == s.MOVE_REASON
    assert doc["view"]["decisions"][0]["name"] == "web/frontend-7d9f/nginx"
    assert len(doc["view"]["cpus"]) == 8


def full_exposition() -> str:
    from perfbalance.cpuset import CpuSet
    from perfbalance.sandbox import GuestNode, PodHugepages, VcpuPinning
    pinning = VcpuPinning(pod="uid-web", vmm_pid=1, affinity={}, vcpu_threads={}, helpers=(),
                          guest_numa=(GuestNode(id=0, vcpus=CpuSet([1, 2]), host_node=0, host_cpus=CpuSet([2, 3]),
                                                hugepages=2, memory_bytes=4 << 20),),
                          hugepages=(PodHugepages(page_size_bytes=2 << 20, total=2, per_node={0: 2}),))
    io = {"io_read_bytes_per_second": 1e6, "io_write_bytes_per_second": 2e6, "io_read_ops_per_second": 10.0,
          "io_write_ops_per_second": 20.0}
    web = dataclasses.replace(s.WEB, metrics={**s.WEB.metrics, **io})
    classes = {"controllers": {"blockio": {"used": True, "reason": "", "containers": {"slow": 1}, "problems": 1,
                                           "errors_total": 2}},
               "containers": {"c-web": {"blockio": "slow"}}}
    st = s.state(dataclasses.replace(s.report((s.TRAINER, web, s.DB)), vcpu_map={"c-web": {2: 1, 3: 2}},
                                     vcpu_pinning=(pinning,), classes=classes))
    st.extra["mqtt"] = {"configured": 1}
    st.extra["resctrl_classes"] = {"gold": ClassUsage(llc_occupancy_bytes=4e6, mbm_total_bytes_total=1e9,
                                                      mbm_local_bytes_total=8e8)}
    st.action_errors_total["EINVAL"] += 1
    st.collector_errors_total["cgroup"] += 1
    return generate_latest(make_registry(st, bandwidth_peak=1e10)).decode()


def documented() -> set[str]:
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `(perfbalance_[a-z0-9_]+)` \|", doc, re.M))


def test_rdt_class_usage_is_exported_per_class_as_counters() -> None:
    fams = {f.name: f for f in text_string_to_metric_families(full_exposition())}
    mbm = fams["perfbalance_resctrl_class_mbm_total_bytes"]
    assert mbm.type == "counter"
    assert [(x.labels, x.value) for x in mbm.samples if x.name.endswith("_total")] == [({"class": "gold"}, 1e9)]
    occ = fams["perfbalance_resctrl_class_llc_occupancy_bytes"]
    assert occ.type == "gauge" and occ.samples[0].value == 4e6


def test_vcpu_pinning_is_exported_once_per_pinned_host_cpu() -> None:
    fams = {f.name: f for f in text_string_to_metric_families(full_exposition())}
    pins = sorted((x.labels["host_cpu"], x.labels["vcpu"]) for x in fams["perfbalance_vcpu_pin_info"].samples)
    assert pins == [("2", "1"), ("3", "2")]
    assert {(x.labels["namespace"], x.labels["container"]) for x in fams["perfbalance_vcpu_pin_info"].samples} \
        == {("web", "nginx")}


def test_every_exported_metric_is_documented() -> None:
    names = {f.name + ("_total" if f.type == "counter" else "")
             for f in text_string_to_metric_families(full_exposition())}
    assert names - documented() == set()


def test_every_documented_metric_is_exported() -> None:
    exposed = set(re.findall(r"^(perfbalance_[a-z0-9_]+)", full_exposition(), re.M))
    assert documented() - exposed == set()


@pytest.mark.parametrize("seed", range(6))
def test_contamination_is_the_share_of_a_containers_cpus_on_cores_of_heavy_others(seed: int) -> None:
    """Against the definition, container by container: its CPUs that share a physical core
    (SMT siblings included) with any CPU another AVX-512-heavy container may run on."""
    import random

    from agent.export.report import avx512_contamination, effective_cpus, is_heavy
    from perfbalance.cpuset import CpuSet, union
    from perfbalance.model import Container, Snapshot
    from perfbalance.topology import synthetic

    topo = synthetic(packages=1, nodes_per_package=2, cores_per_node=8, threads_per_core=2)
    cpus, rng = sorted(topo.online), random.Random(seed)

    def sample(i: int) -> ContainerSample:
        heavy = i < 3 or rng.random() < 0.1  # heavy ones always pinned: one on every CPU would taint all
        pinned = heavy or rng.random() < 0.9
        cpuset = CpuSet(rng.sample(cpus, rng.randint(1, 4))) if pinned else CpuSet()
        return ContainerSample(container=Container(id=f"c{i}", cgroup=f"k/p{i}/c{i}", cpuset=cpuset),
                               metrics={"avx512_heavy": 1.0 if heavy else 0.0})

    samples = tuple(sample(i) for i in range(30))
    snap = Snapshot(time=0.0, window=1.0, node="n", topology=topo, containers=samples)

    def by_definition(s: ContainerSample) -> float:
        others = union(effective_cpus(o, snap) for o in samples if o.id != s.id and is_heavy(o))
        mine = effective_cpus(s, snap)
        return len(mine & topo.whole_cores(others)) / len(mine)

    got = avx512_contamination(snap)
    assert {v for v in got.values()} - {0.0, 1.0}  # some containers only partly contaminated
    assert got == {s.id: by_definition(s) for s in samples}


def test_agent_memory_is_exported_with_each_cycles_report() -> None:
    assert "perfbalance_agent_memory_bytes" not in scrape(AgentState())  # read once per cycle: none yet
    fams = scrape(s.state())
    assert value(fams, "perfbalance_agent_memory_bytes", kind="resident") > 0
    assert value(fams, "perfbalance_agent_memory_bytes", kind="malloc_inuse") > 0  # glibc here
    assert value(fams, "perfbalance_agent_python_allocated_blocks") > 0


def test_heap_in_use_follows_live_data_and_falls_when_it_is_freed() -> None:
    before = selfmem.read()
    held = [bytearray(4096) for _ in range(4096)]  # 16 MiB through malloc, 4096 Python objects
    during = selfmem.read()
    del held
    after = selfmem.read()
    assert during.malloc_inuse - before.malloc_inuse >= 16 << 20
    assert during.python_blocks - before.python_blocks >= 4096
    assert after.malloc_inuse - before.malloc_inuse < 1 << 20  # control: freed, not held
    assert after.python_blocks - before.python_blocks < 1024


def test_status_fields_that_are_missing_or_odd_are_left_out() -> None:
    assert selfmem.parse_status("VmRSS:\t  2048 kB\nRssAnon:\t12 kB\n") == {"resident": 2 << 20, "anonymous": 12 << 10}
    assert selfmem.parse_status("VmRSS:\tlots kB\nRssAnon:\t12 MB\nName:\tx\n") == {}
    mem = selfmem.SelfMemory(resident=1, python_blocks=3)
    assert mem.by_kind() == {"resident": 1}  # no mallinfo2: the malloc kinds are absent, not 0
