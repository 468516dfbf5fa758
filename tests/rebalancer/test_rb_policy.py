"""The policy contract (rebalancer.policy) and the registry of installed policies."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perfbalance.errors import ConfigError
from perfbalance.model import Plan, PolicyState
from perfbalance.settings import setting
from rebalancer import RebalancerConfig, registry
from rebalancer.planner import POLICY as COSTMODEL
from rebalancer.policy import Policy, PolicyError, check_plan, check_policy, section
from rebalancer.spread import POLICY as SPREAD
from rebalancer.spread import SpreadConfig

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoodConfig:
    level: int = setting(1, "A level.", min=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoodState(PolicyState):
    n: int = 0


def good_plan(snapshot: Any, config: Any, state: Any, now: float) -> Plan:
    return Plan(time=now, state=GoodState(n=1))


def policy(**over: Any) -> Policy:
    fields: dict[str, Any] = dict(name="good", plan=good_plan, config_type=GoodConfig, state_type=GoodState)
    return Policy(**{**fields, **over})


def test_builtin_policies_fit_the_contract() -> None:
    assert check_policy(COSTMODEL, name="costmodel") is COSTMODEL
    assert check_policy(SPREAD, name="spread") is SPREAD


def test_builtins_are_registered_as_entry_points() -> None:
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    assert names.get("costmodel") == registry.BUILTIN["costmodel"]
    assert names.get("spread") == registry.BUILTIN["spread"]
    assert registry.load("spread") is SPREAD


@pytest.mark.parametrize(("over", "needle"), [
    ({"plan": lambda snapshot, config: None}, "must take exactly (snapshot, config, state, now)"),
    ({"plan": lambda a, b, c, d, e: None}, "must take exactly"),
    ({"plan": "not a function"}, "not callable"),
    ({"config_type": dict}, "is not a dataclass"),
    ({"config_type": dataclasses.make_dataclass("Loose", [("x", int, dataclasses.field(default=1, metadata={"doc": "x"}))])},
     "must be a frozen dataclass"),
    ({"config_type": dataclasses.make_dataclass("NoDefault", [("x", int)], frozen=True)}, "has no default"),
    ({"config_type": dataclasses.make_dataclass("NoDoc", [("x", int, dataclasses.field(default=1))], frozen=True)},
     "is not documented"),
    ({"config_type": dataclasses.make_dataclass(
        "BadDefault", [("x", int, setting(-1, "x", min=0))], frozen=True)}, "defaults do not validate"),
    ({"state_type": "int"}, "state_type 'int' is not a type"),
    ({"state_type": int}, "state_type int must be a dataclass extending perfbalance.model.PolicyState"),
    ({"state_type": dataclasses.make_dataclass("Needy", [("n", int)], bases=(PolicyState,), frozen=True, kw_only=True)},
     "state_type Needy cannot be built from dwell times and cooldowns alone"),
    ({"name": "other"}, "calls itself 'other'"),
])
def test_contract_violations_are_refused_at_load(over: dict[str, Any], needle: str) -> None:
    check_policy(policy(), name="good")  # control: the unbroken policy passes
    with pytest.raises(PolicyError, match="policy 'good'") as e:
        check_policy(policy(**over), name="good")
    assert needle in str(e.value)


def test_a_plan_extra_keyword_with_default_is_allowed() -> None:
    check_policy(policy(plan=lambda snapshot, config, state, now, debug=False: None), name="good")


def test_check_plan_wants_a_plan_with_the_declared_state() -> None:
    p = policy()
    assert check_plan(p, Plan(time=1.0, state=GoodState(n=3))).state == GoodState(n=3)
    with pytest.raises(PolicyError, match="returned a list"):
        check_plan(p, [])
    with pytest.raises(PolicyError, match="state of type PolicyState, not GoodState"):
        check_plan(p, Plan(time=1.0, state=PolicyState()))


def test_unknown_policy_names_the_installed_ones() -> None:
    with pytest.raises(PolicyError) as e:
        registry.load("nope")
    assert "not installed" in str(e.value) and "costmodel" in str(e.value) and "spread" in str(e.value)


def test_an_entry_point_that_fails_to_import_is_one_error_naming_it() -> None:
    def importer(module: str) -> Any:
        raise ImportError("No module named 'numpyy'")

    with pytest.raises(PolicyError, match=r"cannot load rebalancer.spread:POLICY \(ImportError: No module named 'numpyy'\)"):
        registry.load("spread", importer=importer)


def test_section_is_the_rebalancer_section_for_the_costmodel_and_its_own_otherwise() -> None:
    cfg = RebalancerConfig(policies={"spread": {"tolerance_cores": 2.0}})
    assert section(COSTMODEL, cfg) is cfg
    assert section(SPREAD, cfg) == SpreadConfig(tolerance_cores=2.0)
    assert section(SPREAD, RebalancerConfig()) == SpreadConfig()


def test_check_config_names_key_path_and_value() -> None:
    registry.check_config(RebalancerConfig(policy="spread", policies={"spread": {"tolerance_cores": 1.0}}), source="c.yaml")
    with pytest.raises(ConfigError) as e:
        registry.check_config(RebalancerConfig(policy="sprad"), source="c.yaml")
    assert "rebalancer.policy" in str(e.value) and "sprad" in str(e.value) and "c.yaml" in str(e.value)
    with pytest.raises(ConfigError) as e:
        registry.check_config(RebalancerConfig(policies={"spread": {"tolerance_cores": -1}}), source="c.yaml")
    assert "rebalancer.policies.spread.tolerance_cores" in str(e.value) and "-1" in str(e.value)
    with pytest.raises(ConfigError, match="rebalancer.policies.costmodel"):
        registry.check_config(RebalancerConfig(policies={"costmodel": {}}), source="c.yaml")


def _lint(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """import-linter's purity contract applied to a throwaway policy package."""
    pkg = tmp_path / "pbtest_policies"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mypolicy.py").write_text(textwrap.dedent(body))
    cfg = tmp_path / "contracts.toml"
    cfg.write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_packages = ["pbtest_policies"]
        include_external_packages = true
        [[tool.importlinter.contracts]]
        name = "policy is pure"
        type = "forbidden"
        source_modules = ["pbtest_policies.mypolicy"]
        forbidden_modules = ["os", "time", "random", "threading", "socket", "importlib"]
        """))
    linter = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(linter), "--no-cache", "--config", str(cfg)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_purity_contract_catches_a_clock_in_a_policy(tmp_path: Path) -> None:
    pure = _lint(tmp_path / "a", "import math\ndef plan(snapshot, config, state, now):\n    return math.floor(now)\n")
    assert pure.returncode == 0, pure.stdout + pure.stderr
    impure = _lint(tmp_path / "b", "import time\ndef plan(snapshot, config, state, now):\n    return time.time()\n")
    assert impure.returncode != 0
    assert "pbtest_policies.mypolicy -> time" in impure.stdout


def test_in_tree_policies_keep_the_purity_contract() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "in-tree policies are pure" in done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
