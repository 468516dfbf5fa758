"""The planner's shortcuts give exactly what the plain computation gives (issue #16, round 3).

Each shortcut of rebalancer/ that plan() takes at 1000 containers is checked against the
computation it replaces, on random nodes, for exact (bit-identical) equality: a layout derived
with Layout.moved against the same layout built whole, the water-filling loads against the sums
of the grants, the licence probability from SMT sibling pairs against the per-core product, a
group's sums in C against the member-by-member loop, move_costs against move_cost per container
and move_cost_total against their sum, the allocator's remembered answers against a fresh index,
a layout scored from the layout it was derived from (its water filling taken over where the
change cannot reach) against the same layout scored whole, and plans made with an index kept
from an earlier call against plans made with a fresh one (issue #16, round 4).
tests/rebalancer/test_rb_plan_equivalence.py checks whole plans against the golden file.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer import RebalancerConfig
from rebalancer.allocator import allocate
from rebalancer.context import Context
from rebalancer.costmodel import (CostModel, Layout, licence_by_busy_pairs, licence_by_core, licence_by_pairs,
                                  move_cost, move_cost_total, move_costs, sum_each, sum_plain)
from rebalancer.inputs import smooth
from rebalancer import plan, topoindex
from rebalancer.sharing import fill_order, water_fill, water_fill_from
from rebalancer.state import PlannerState
from rebalancer.topoindex import TopoIndex

from rb_builders import SKYLAKE, avx_vs_scalar, sample, snap, topo

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CFG = RebalancerConfig()
RDT = "rdt-low"


@st.composite
def contexts(draw: st.DrawFn, *, threads: int | None = None) -> Context:
    t = topo(cores=draw(st.integers(1, 4)), threads=threads or draw(st.integers(1, 3)),
             packages=draw(st.integers(1, 2)), l3=draw(st.integers(1, 2)), model=SKYLAKE)
    online = sorted(t.online.ids)
    cpus = st.lists(st.sampled_from(online), min_size=1, unique=True)
    samples = []
    for i in range(draw(st.integers(1, 8))):
        here = ",".join(map(str, draw(cpus)))
        samples.append(sample(
            f"c{i}", here, request=draw(st.sampled_from([0, 250, 1000])),
            mems=draw(st.sampled_from(["", "0"])), rdt=draw(st.sampled_from(["", RDT])),
            cpu_usage_cores=draw(st.floats(0.0, 3.0)), avx512_heavy=draw(st.sampled_from([0.0, 1.0])),
            llc_misses_per_second=draw(st.sampled_from([0.0, 1e6, 5e7])),
            llc_mpki=draw(st.floats(0.0, 40.0)),
            memory_bandwidth_bytes_per_second=draw(st.sampled_from([0.0, 1e9, 3e10])),
            memory_bytes=draw(st.sampled_from([0.0, 2.0**30])),
            llc_occupancy_bytes=draw(st.sampled_from([0.0, 2.0**23]))))
    s = snap(t, *samples)
    return Context.build(s, CFG, PlannerState(), smooth(s, {}, CFG.smoothing_alpha), 0.0)


def _sums(layout: Layout) -> dict[frozenset[int], tuple[Any, ...]]:
    return {k: (g.members, g.u, g.au, g.m, g.mr, g.b, g.req) for k, g in layout.groups.items()}


def _moves(draw: st.DrawFn, ctx: Context) -> tuple[dict[str, frozenset[int]], dict[str, str]]:
    online = sorted(ctx.idx.online)
    ids = sorted(ctx.views)
    shared = frozenset(draw(st.lists(st.sampled_from(online), min_size=1, unique=True)))
    own = st.lists(st.sampled_from(online), min_size=1, unique=True).map(frozenset)
    # several containers to one target object (as a decision does), others to their own
    targets = {c: shared if draw(st.booleans()) else draw(own)
               for c in draw(st.lists(st.sampled_from(ids), unique=True))}
    classes = {c: draw(st.sampled_from(["", RDT])) for c in draw(st.lists(st.sampled_from(ids), unique=True))}
    return targets, classes


def _baselined(ctx: Context, rdt: str) -> tuple[CostModel, Layout]:
    """The context's cost model and its base layout, set as the model's baseline."""
    model = CostModel(idx=ctx.idx, views=ctx.views, config=CFG, aggressor_class=rdt)
    base = model.layout(ctx.base.placement, ctx.base.classes)
    model.set_baseline(base)
    return model, base


@SETTINGS
@given(st.data(), contexts(), st.sampled_from(["", RDT]))
def test_a_moved_layout_scores_exactly_as_the_same_layout_built_whole(data: st.DataObject, ctx: Context,
                                                                      rdt: str) -> None:
    model, base = _baselined(ctx, rdt)
    targets, classes = _moves(data.draw, ctx)
    after = base.moved(model, targets, classes)
    whole = model.layout(after.placement, after.classes)
    assert _sums(after) == _sums(whole)
    assert model.evaluate(after) == model.evaluate(whole)
    # control: a move that changes where a container runs changes the groups
    if any(base.placement[c] != t for c, t in targets.items()):
        assert _sums(after) != _sums(base)


@SETTINGS
@given(st.data(), contexts(), st.sampled_from(["", RDT]))
def test_a_layout_scored_from_its_parent_scores_exactly_as_scored_whole(data: st.DataObject, ctx: Context,
                                                                        rdt: str) -> None:
    model, base = _baselined(ctx, rdt)
    ev = model.evaluate(base)
    after = base.moved(model, *_moves(data.draw, ctx))
    ev_after = model.evaluate(after, (base, ev))
    assert ev_after == model.evaluate(after)
    # a second decision from the first one's layout, as the greedy loop takes it
    again = after.moved(model, *_moves(data.draw, ctx))
    assert model.evaluate(again, (after, ev_after)) == model.evaluate(again)


GROUPS = st.lists(st.tuples(st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
                            st.floats(0.0, 6.0)), max_size=8)


def _in_fill_order(groups: list[tuple[list[int], float]]) -> list[tuple[frozenset[int], float]]:
    unique = {frozenset(c): d for c, d in groups}
    return sorted(unique.items(), key=lambda g: fill_order(g[0]))


@SETTINGS
@given(GROUPS, GROUPS, st.data())
def test_water_filling_from_an_earlier_layout_grants_exactly_what_filling_afresh_does(
        old: list[tuple[list[int], float]], new: list[tuple[list[int], float]], data: st.DataObject) -> None:
    before = _in_fill_order(old)
    # the new layout: some earlier groups kept (some with another demand), others new
    kept = [(k, data.draw(st.sampled_from([d, d + 0.5]))) for k, d in before if data.draw(st.booleans())]
    now = _in_fill_order([(sorted(k), d) for k, d in kept] + new)
    grants, _ = water_fill(before)
    prior = {k: (d, g) for (k, d), g in zip(before, grants)}
    keys = [k for k, _ in now]
    gone = [(sum(fill_order(k) < fill_order(r) for k in keys), r) for r, _ in before if r not in dict(now)]
    got = water_fill_from(now, prior, sorted(gone, key=lambda x: x[0]))
    assert got == water_fill(now)
    # control: with nothing changed every group keeps the grants it had, the same dicts
    same, _ = water_fill_from(before, prior, [])
    assert all(g is prior[k][1] for (k, _), g in zip(before, same))


def test_a_group_filled_after_a_vanished_or_changed_one_on_its_cpus_is_filled_afresh() -> None:
    one, two, far = frozenset({0}), frozenset({0, 1}), frozenset({2, 3})
    before = [(one, 1.0), (two, 1.0), (far, 1.0)]
    grants, _ = water_fill(before)
    prior = {k: (d, g) for (k, d), g in zip(before, grants)}
    for now, gone in (([(two, 1.0), (far, 1.0)], [(0, one)]),  # the single CPU's group went
                      ([(one, 0.5), (two, 1.0), (far, 1.0)], [])):  # it asks for less
        got, loads = water_fill_from(now, prior, gone)
        assert (got, loads) == water_fill(now)
        assert got[-2] != prior[two][1] and got[-1] is prior[far][1]  # CPU 0 freed; 2-3 untouched


@SETTINGS
@given(st.lists(st.tuples(st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
                          st.floats(0.0, 6.0)), max_size=8))
def test_water_filling_loads_are_the_sums_of_the_grants_in_order(groups: list[tuple[list[int], float]]) -> None:
    ordered = sorted(((frozenset(c), d) for c, d in groups), key=lambda g: fill_order(g[0]))
    contribs, loads = water_fill(ordered)
    summed: dict[int, float] = {}
    for contrib in contribs:
        for cpu, x in contrib.items():
            summed[cpu] = summed.get(cpu, 0.0) + x
    assert loads == summed
    # control: a real demand is granted somewhere
    if any(d > 1e-9 for _, d in ordered):
        assert loads and max(loads.values()) > 0.0


@SETTINGS
@given(st.data(), st.integers(1, 4), st.integers(1, 2))
def test_licence_from_sibling_pairs_is_the_per_core_product(data: st.DataObject, cores: int, packages: int) -> None:
    idx = TopoIndex.build(topo(cores=cores, threads=2, packages=packages))
    cpus = data.draw(st.lists(st.sampled_from(sorted(idx.online)), unique=True))
    avx_t = {c: data.draw(st.floats(0.0, 1.5)) for c in cpus}
    free_of = {c: 1.0 - min(1.0, a) for c, a in avx_t.items()}
    sibling = idx.sibling_of()
    assert sibling is not None
    by_core = licence_by_core(idx.core_of, idx.cores, free_of)
    assert licence_by_pairs(sibling, free_of) == by_core
    assert licence_by_busy_pairs(sibling, avx_t) == by_core


def test_the_sibling_shortcut_is_taken_only_where_every_core_has_two_threads() -> None:
    assert TopoIndex.build(topo(threads=2)).sibling_of() is not None
    assert TopoIndex.build(topo(threads=1)).sibling_of() is None
    assert TopoIndex.build(topo(threads=3)).sibling_of() is None


@SETTINGS
@given(st.lists(st.tuples(st.floats(0.0, 4.0), st.floats(0.0, 4.0), st.floats(0.0, 1e8),
                          st.floats(0.0, 1e10), st.integers(0, 4000)), max_size=12))
def test_group_sums_in_c_are_the_member_by_member_sums(rows: list[tuple[float, float, float, float, int]]) -> None:
    inputs = {f"c{i:02d}": r for i, r in enumerate(rows)}
    members = tuple(sorted(inputs))
    assert sum_plain(inputs, members) == sum_each(inputs, members, frozenset())
    # control: a restricted member's misses count apart
    if members and rows[0][2] > 0:
        assert sum_each(inputs, members, frozenset(members[:1])).mr == rows[0][2]


@SETTINGS
@given(st.data(), contexts())
def test_move_costs_are_move_cost_of_each_container(data: st.DataObject, ctx: Context) -> None:
    targets, _ = _moves(data.draw, ctx)
    got = move_costs(ctx.views, ctx.base.placement, targets, ctx.idx, CFG)
    assert list(got) == list(targets)
    assert got == {c: move_cost(ctx.views[c], ctx.base.placement[c], t, ctx.idx, CFG) for c, t in targets.items()}
    total = move_cost_total(ctx.views, ctx.base.placement, targets, ctx.idx, CFG)
    assert repr(total) == repr(sum(sum(c) for c in got.values()))
    # control: moving anything costs at least the disruption
    if targets:
        assert total >= CFG.disruption_core_seconds or all(ctx.base.placement[c] == t for c, t in targets.items())


@SETTINGS
@given(st.data(), st.integers(1, 4), st.integers(1, 2), st.integers(1, 2))
def test_the_allocator_answers_from_memory_as_a_fresh_index_does(data: st.DataObject, cores: int, threads: int,
                                                                  packages: int) -> None:
    t = topo(cores=cores, threads=threads, packages=packages)
    warm = TopoIndex.build(t)
    online = sorted(warm.online)
    questions = data.draw(st.lists(st.tuples(
        st.lists(st.sampled_from(online), unique=True).map(frozenset), st.integers(0, len(online)),
        st.booleans(), st.lists(st.sampled_from(sorted(warm.nodes)), unique=True), st.booleans()),
        min_size=1, max_size=6))
    for free, count, whole, prefer, hp in questions + questions:  # the second round from memory
        kw = {"whole_cores": whole, "prefer_nodes": prefer, "high_priority": hp}
        assert allocate(warm, free, count, **kw) == allocate(TopoIndex.build(t), free, count, **kw)  # type: ignore[arg-type]
    # control: the second round added nothing to the memory
    size = len(warm.memo)
    for free, count, whole, prefer, hp in questions:
        allocate(warm, free, count, whole_cores=whole, prefer_nodes=prefer, high_priority=hp)
    assert len(warm.memo) == size


def test_a_built_record_equals_the_one_its_init_makes_and_stays_frozen() -> None:
    import dataclasses

    import pytest

    from perfbalance.model import Action, Container
    from rebalancer.state import Moved, built

    fields = {"kind": "cpuset", "container": "c1", "frm": "0-7", "to": "0-3", "reason": "r", "benefit": 0.5,
              "cost": 0.1, "victims": ("v",), "mems": "0", "undoes": "", "decision": "d1", "detail": {"a": 1.0}}
    a = built(Action, dict(fields))
    assert a == Action(**fields) and repr(a) == repr(Action(**fields))
    assert built(Moved, {"container": "c", "frm": "0", "to": "1", "mems_frm": "", "mems_to": "", "kind": "cpuset"}) \
        == Moved(container="c", frm="0", to="1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.cost = 1.0  # type: ignore[misc]
    # control: a missing or unknown field, or a class that validates in __post_init__, is refused
    with pytest.raises(TypeError, match="undoes"):
        built(Action, {k: v for k, v in fields.items() if k != "undoes"})
    with pytest.raises(TypeError, match="extra"):
        built(Action, {**fields, "extra": 1})
    with pytest.raises(TypeError, match="__post_init__"):
        built(Container, {})


def test_an_equal_topology_gets_the_kept_index_and_plans_as_with_a_fresh_one() -> None:
    s = avx_vs_scalar()
    first = plan(s, CFG, None, 0.0)
    assert first.actions
    idx = topoindex.index_of(s.topology)
    assert idx.memo  # the first plan left its answers there
    assert topoindex.index_of(topo()) is idx  # an equal topology, another object
    again = plan(s, CFG, None, 0.0)
    topoindex._kept.clear()
    fresh = plan(s, CFG, None, 0.0)
    assert topoindex.index_of(s.topology) is not idx
    assert repr(again) == repr(first) == repr(fresh)
    # control: another topology gets its own index; an overgrown memo is not carried on
    assert topoindex.index_of(topo(cores=2)) is not topoindex.index_of(s.topology)
    grown = topoindex.index_of(s.topology)
    grown.memo.update({("test", i): i for i in range(topoindex.MAX_MEMO + 1)})
    assert topoindex.index_of(s.topology) is not grown


@SETTINGS
@given(st.dictionaries(st.text(max_size=4), st.floats(allow_nan=False), max_size=12), st.booleans())
def test_a_frozen_map_of_keys_in_order_is_the_one_sorted_by_items(d: dict[str, float], in_order: bool) -> None:
    from types import MappingProxyType

    from rebalancer.state import frozen_map

    if in_order:
        d = dict(sorted(d.items()))
    got = frozen_map(d)
    assert isinstance(got, MappingProxyType)
    assert list(got.items()) == sorted(d.items())
    # control: the copy is read-only and does not follow the source
    d["zzzzz"] = 1.0
    assert "zzzzz" not in got


METRIC = st.one_of(st.none(), st.sampled_from([0.0, -0.0, -1.0, 0.005]), st.floats(-10.0, 1e9))


@SETTINGS
@given(st.fixed_dictionaries({}, optional={k: METRIC.filter(lambda x: x is not None) for k in (
    "cpu_usage_cores", "llc_misses_per_second", "llc_mpki", "memory_bandwidth_bytes_per_second",
    "instructions_per_second", "memory_bytes", "llc_occupancy_bytes", "avx512_heavy")}),
    st.integers(-100, 4000), st.integers(-1, 2**31))
def test_a_view_has_the_fields_the_plain_formulas_give(m: dict[str, float], request: int, memory: int) -> None:
    from dataclasses import replace

    from rebalancer.inputs import View, view

    s = sample("c", "0-1", request=0)
    s = replace(s, container=replace(s.container, request_mcpu=request, memory_bytes=memory))
    usage = max(0.0, m.get("cpu_usage_cores", 0.0))
    ips = m.get("instructions_per_second")
    want = View(id="c", usage=usage, request_mcpu=max(0, request),
                heavy=m.get("avx512_heavy", 0.0) > CFG.avx512_heavy_threshold,
                misses=max(0.0, m.get("llc_misses_per_second", 0.0)), mpki=max(0.0, m.get("llc_mpki", 0.0)),
                occupancy=m.get("llc_occupancy_bytes"),
                bandwidth=max(0.0, m.get("memory_bandwidth_bytes_per_second", 0.0)),
                memory_bytes=int(max(memory, m.get("memory_bytes", 0.0))),
                ips_per_core=ips / usage if ips is not None and usage > 0.01 else None,
                exclusive=False, rdt_class="", cpuset=frozenset({0, 1}), mems=frozenset(), sandbox_pod="p")
    got = view(s, m, CFG, "p")
    assert type(got) is View and repr(got) == repr(want)  # repr: 0.0 and -0.0 apart
    # control: a negative usage is no usage
    assert view(s, {**m, "cpu_usage_cores": -1.0}, CFG).usage == 0.0
