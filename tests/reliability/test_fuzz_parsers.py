"""Fuzzing every parser of host and user input: it parses, or raises the documented error.

Property (hostile and bad input): for arbitrary text/bytes/JSON, a parser returns a
value or raises perfbalance's ParseError/ConfigError (or the module's own subclass) -- never
another exception type, never a hang. Strategies mix random text with fragments of the real
syntax so that hypothesis reaches past the first token. Examples are bounded (200 per test).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.discover import containers as discovery, kubelet, sysfs
from agent.config import parse_config
from collectors import archstatus
from perfbalance import cgroupfs as cg
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ConfigError, ParseError
from perfbalance.model import Snapshot
from perfbalance.topology import synthetic
from resctrl import info as rinfo
from resctrl.schemata import Schemata

# PB_FUZZ_EXAMPLES raises the count for a longer local run (the default keeps `make test` quick).
FUZZ = settings(max_examples=int(os.environ.get("PB_FUZZ_EXAMPLES", "200")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(120)


def only(allowed: type[BaseException] | tuple[type[BaseException], ...],
         fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call fn; an exception other than `allowed` fails the test with the input shown."""
    try:
        return fn(*args, **kwargs)
    except allowed:
        return None
    except Exception as e:  # the property under test
        raise AssertionError(f"{fn.__qualname__}{args!r} raised {type(e).__name__}: {e}") from e


def fragments(*pieces: str, size: int = 20) -> st.SearchStrategy[str]:
    """Text built from syntax fragments, random text and numbers (reaches deeper than text())."""
    numbers = st.integers(min_value=-(10 ** 30), max_value=10 ** 30).map(str)
    atoms = st.one_of(st.sampled_from(pieces), numbers, st.text(max_size=6),
                      st.sampled_from(["nan", "inf", "-1", "1e999", "0x", "٣", "²", "1_0", " ", "\n", "\x00"]))
    return st.lists(atoms, max_size=size).map("".join)


ANY_TEXT = st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", "replace")))

# -- cpusets ----------------------------------------------------------------------------------

CPULIST = fragments("0", "1", "3", "-", ",", "8-15", "65535", "65536", " ", "\n")


@FUZZ
@given(st.one_of(ANY_TEXT, CPULIST))
def test_cpuset_parse(text: str) -> None:
    s = only(ParseError, CpuSet.parse, text)
    if s is not None:
        assert CpuSet.parse(str(s)) == s  # whatever parses round-trips


@FUZZ
@given(st.one_of(ANY_TEXT, fragments("0x", "ff", ",", "00000001", "f" * 20, "g")))
def test_cpuset_parse_mask(text: str) -> None:
    s = only(ParseError, CpuSet.parse_mask, text)
    if s is not None:
        assert CpuSet.parse_mask(format(s.mask(), "x")) == s


# -- sysfs --------------------------------------------------------------------------------------

@FUZZ
@given(st.one_of(ANY_TEXT, fragments("32768", "K", "M", "G", "k", " ", "\n")))
def test_sysfs_scalar_parsers(text: str) -> None:
    only(ParseError, sysfs.parse_int, text)
    only(ParseError, sysfs.parse_cache_size, text)
    assert isinstance(sysfs.parse_cpu_model(text), str)


@FUZZ
@given(st.one_of(ANY_TEXT, fragments("Node ", "0", " MemTotal:", " ", "kB", "\n", "MemFree:")))
def test_sysfs_node_meminfo(text: str) -> None:
    only(ParseError, sysfs.parse_node_meminfo, text)


# -- cgroup stat files -------------------------------------------------------------------------

STAT = fragments("usage_usec ", "user_usec ", "nr_periods ", "nr_throttled ", "throttled_usec ",
                 "throttled_time ", "\n", " ", "max", "100000")
PSI = fragments("some ", "full ", "avg10=", "avg60=", "avg300=", "total=", "avgX=", "1.23", " ", "\n", "=")
CG_PARSERS = [cg.parse_id_list, cg.parse_int_text, cg.parse_flat_keyed, cg.parse_cpu_stat,
              cg.parse_cpuacct_usage, cg.parse_memory_limit, cg.parse_memory_usage, cg.parse_cpu_max,
              cg.parse_psi]


@FUZZ
@given(st.one_of(ANY_TEXT, STAT, PSI), st.sampled_from(CG_PARSERS))
def test_cgroup_stat_parsers(text: str, parser: Callable[..., Any]) -> None:
    only(ParseError, parser, text, source="fuzz")


@FUZZ
@given(PSI)
def test_psi_values_are_finite_fractions(text: str) -> None:
    psi = only(ParseError, cg.parse_psi, text)
    if psi is not None:
        for v in (psi.some_avg10, psi.some_avg60, psi.some_avg300, psi.full_avg10):
            assert 0.0 <= v <= 1.0
        assert psi.some_total_usec >= 0


@FUZZ
@given(fragments("max", " ", "100000", "-1", "0", "\n"))
def test_cpu_max_has_a_positive_period(text: str) -> None:
    cmax = only(ParseError, cg.parse_cpu_max, text)
    if cmax is not None:
        assert cmax.period_usec > 0


# -- discovery names (directory names are chosen by whoever creates cgroups) -------------------

NAMES = fragments("kubepods-", "burstable", "-pod", "0123abcd-0123-4567-89ab-0123456789ab", ".slice",
                  "cri-containerd-", "crio-", "conmon-", ".scope", "/", "..", "\n", "\x7f")


@FUZZ
@given(st.one_of(ANY_TEXT, NAMES))
def test_discovery_name_parsers(name: str) -> None:
    only(ParseError, discovery.check_name, name)
    pod = discovery.parse_pod_dir(name)
    if pod is not None:
        assert "/" not in pod[0] and ".." not in pod[0]
    ctr = discovery.parse_container_dir(name)
    if ctr is not None:
        assert "/" not in ctr[0] and ctr[0] not in (".", "..")
    only(ParseError, cg.check_glob, name)


# -- kubelet cpu_manager_state -----------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)
STATE_KEYS = ["policyName", "defaultCpuSet", "entries", "podEntries", "checksum", "data", "version",
              "POLICYNAME", "apiVersion"]


@st.composite
def kubelet_docs(draw: st.DrawFn) -> str:
    base: dict[str, Any] = {"policyName": "static", "defaultCpuSet": "0-3",
                            "entries": {"uid": {"c": "4-5"}}, "checksum": 1}
    for key in draw(st.lists(st.sampled_from(STATE_KEYS), max_size=3)):
        base[key] = draw(st.one_of(JSON, CPULIST, st.just(json.dumps(base))))
    text = json.dumps(base)
    cut = draw(st.integers(min_value=0, max_value=len(text)))
    return text if draw(st.booleans()) else text[:cut]  # half-written files too


@FUZZ
@given(st.one_of(ANY_TEXT, kubelet_docs(), JSON.map(json.dumps)))
def test_kubelet_state(text: str) -> None:
    only(kubelet.KubeletStateError, kubelet.parse_cpu_manager_state, text, path="fuzz")


@pytest.mark.parametrize("text", [
    "[" * 100_000,  # nesting beyond the JSON decoder's recursion limit
    '{"policyName": "static", "x": ' + "1" * 5000 + "}",  # integer beyond int-from-str limit
    '{"policyName": "static", "version": "v²"}',  # a digit that is not a decimal digit
    '{"data": "' + "[" * 100_000 + '"}',
], ids=["deep", "bigint", "unicode-digit", "deep-data"])
def test_kubelet_state_adversarial(text: str) -> None:
    with pytest.raises(kubelet.KubeletStateError):
        kubelet.parse_cpu_manager_state(text, path="fuzz")


# -- resctrl (parsers owned by the resctrl room; tested here, read only) -----------------------

SCHEMATA = fragments("L3:", "MB:", "L3CODE:", "0=", "1=", "fffff", "50", ";", "\n", " ", "=")


@FUZZ
@given(st.one_of(ANY_TEXT, SCHEMATA))
def test_resctrl_schemata(text: str) -> None:
    s = only(ParseError, Schemata.parse, text)
    if s is not None:
        assert Schemata.parse(s.format()) == s


@FUZZ
@given(st.dictionaries(st.sampled_from(["cbm_mask", "min_cbm_bits", "num_closids", "shareable_bits",
                                        "sparse_masks", "bandwidth_gran", "min_bandwidth", "num_rmids",
                                        "mon_features", "delay_linear"]),
                       st.one_of(ANY_TEXT, fragments("fffff", "1", "16", "0", "-1", "\n")), max_size=10),
       st.lists(ANY_TEXT, max_size=4), ANY_TEXT)
def test_resctrl_info_parsers(files: dict[str, str], names: list[str], mounts: str) -> None:
    # A missing required file is the reader's problem (it checks which files exist); here every
    # required file is present and only the values are hostile.
    cache = {"cbm_mask": "fffff", "min_cbm_bits": "1", "num_closids": "16", **files}
    only(ParseError, rinfo.parse_cache_info, "L3", cache, ())
    mb = {"num_closids": "8", "bandwidth_gran": "10", "min_bandwidth": "10", **files}
    only(ParseError, rinfo.parse_mb_info, mb, (), mbps=False)
    mon = {"num_rmids": "64", **files}
    only(ParseError, rinfo.parse_mon_info, mon, ())
    assert isinstance(rinfo.parse_mon_domains(names), tuple)
    rinfo.parse_mounts(mounts)


INFO_FILES = st.dictionaries(st.sampled_from(["cbm_mask", "min_cbm_bits", "num_closids", "shareable_bits",
                                              "bandwidth_gran", "min_bandwidth", "num_rmids", "mon_features"]),
                             st.sampled_from(["1", "16", "8"]), max_size=8)  # valid in every file


@FUZZ
@given(INFO_FILES)
def test_resctrl_info_with_files_missing_names_the_file(files: dict[str, str]) -> None:
    # Any subset of the info files (a kernel without one, a half-populated captured tree): a
    # ParseError naming a missing file, never a KeyError.
    for fn, args, kwargs in ((rinfo.parse_cache_info, ("L3", files, ()), {}),
                             (rinfo.parse_mb_info, (files, ()), {"mbps": False}),
                             (rinfo.parse_mon_info, (files, ()), {})):
        try:
            fn(*args, source="info/X", **kwargs)
        except ParseError as e:
            assert "missing" in str(e) and str(e.value).removeprefix("info/X/") not in files
        except Exception as e:
            raise AssertionError(f"{fn.__qualname__}({sorted(files)}) raised {type(e).__name__}: {e}") from e


@FUZZ
@given(st.one_of(ANY_TEXT, fragments("", "20480", "K", "M", "G", "k", " ", "\n", "-", "1.5")))
def test_resctrl_cache_size(text: str) -> None:
    size = only(ParseError, rinfo.parse_size, text)
    assert size is None or size >= 0


def test_resctrl_cache_size_of_nothing_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="cache size"):
        rinfo.parse_size("")


# -- configuration -----------------------------------------------------------------------------

YAML = fragments("agent:", "\n", "  ", "interval_seconds: ", "1", "-5", "nodes:", "n1:", "cpuset:",
                 "reserved_cpus: ", "0-1", "discovery:", "globs: [", "'a/*'", "]", "{", "}", "1: 2",
                 "&a ", "*a", "!!binary ", "!!python/object ", "? ", "- ", "~", "yes", "2024-01-01")


@FUZZ
@given(st.one_of(ANY_TEXT, YAML))
def test_config(text: str) -> None:
    only(ConfigError, parse_config, text, source="fuzz.yaml", node="n1")


@pytest.mark.parametrize("text", [
    "1: 2",  # a non-string key
    "agent: {1: 2}",
    "[" * 50_000,  # nesting beyond the YAML composer's recursion
    "a: &x [1]\nb: *x\n",
    "agent: !!python/object:os.system {}",  # never constructed by safe_load
], ids=["int-key", "nested-int-key", "deep", "alias", "python-tag"])
def test_config_adversarial(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_config(text, source="fuzz.yaml", node="n1")


# -- snapshots ---------------------------------------------------------------------------------

def _snapshot_doc() -> dict[str, Any]:
    return {"cycle": 1, "time": 1.0, "window": 1.0, "node": "n", "topology": synthetic(packages=1, cores_per_node=2).to_json(),
            "containers": [{"id": "a", "cgroup": "x/a", "cpuset": "0-1", "request_mcpu": 500,
                            "metrics": {"cpu_usage_cores": 0.5}}],
            "kubelet": {"policy": "static", "default_cpuset": "0-3", "exclusive": []},
            "collectors": {"cgroup": {"up": True}}, "node_metrics": {}}


@st.composite
def snapshot_docs(draw: st.DrawFn) -> str:
    doc = _snapshot_doc()
    target: Any = doc
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if isinstance(target, dict) and target:
            key = draw(st.sampled_from(sorted(target)))
            if draw(st.booleans()) and isinstance(target[key], (dict, list)):
                target = target[key]
                continue
            target[key] = draw(JSON | st.just(1e400) | st.just(-1e400))
        elif isinstance(target, list) and target:
            target = target[draw(st.integers(min_value=0, max_value=len(target) - 1))]
    text = json.dumps(doc)
    return text if draw(st.booleans()) else text[: draw(st.integers(min_value=0, max_value=len(text)))]


@FUZZ
@given(st.one_of(ANY_TEXT, snapshot_docs(), JSON.map(json.dumps)))
def test_snapshot_loads(text: str) -> None:
    only(ParseError, Snapshot.loads, text)


@pytest.mark.parametrize("text", [
    "[" * 100_000,
    '{"time": 1, "topology": {}, "containers": [], "x": ' + "1" * 5000 + "}",
    json.dumps({**_snapshot_doc(), "cycle": 1e400}),
    json.dumps({**_snapshot_doc(), "containers": [{"id": "a", "cgroup": "x", "request_mcpu": 1e400}]}),
], ids=["deep", "bigint", "inf-cycle", "inf-request"])
def test_snapshot_adversarial(text: str) -> None:
    with pytest.raises(ParseError):
        Snapshot.loads(text)


def test_valid_snapshot_still_loads() -> None:
    snap = Snapshot.loads(json.dumps(_snapshot_doc()))
    assert snap.containers[0].container.cpuset == CpuSet.parse("0-1")


# -- arch_status -------------------------------------------------------------------------------

@FUZZ
@given(st.one_of(ANY_TEXT, fragments("AVX512_elapsed_ms:", "\t", "-1", "0", "12", "\n", ":")))
def test_arch_status(text: str) -> None:
    only(ParseError, archstatus.parse_arch_status, text)
