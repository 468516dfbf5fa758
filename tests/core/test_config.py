import pytest

from agent.config import Config, ConfigWatcher, load_config, parse_config
from perfbalance.classes import BlockIoSection, RtSection
from perfbalance.errors import ConfigError
from perfbalance.names import C_IDENTIFIER, CLASS, GROUP_PREFIX, LABEL_VALUE, PATH_ELEMENT, QUALIFIED_NAME, name_problem
from perfbalance.settings import build


def test_empty_file_is_the_defaults():
    assert parse_config("", source="c.yaml", node="n1") == Config()


def test_unknown_key_names_file_path_and_value():
    with pytest.raises(ConfigError) as e:
        parse_config("rebalancer:\n  margn: 3\n", source="c.yaml", node="n1")
    assert "c.yaml" in str(e.value) and "rebalancer.margn" in str(e.value) and "3" in str(e.value)


@pytest.mark.parametrize("text,path", [
    ("agent:\n  interval_seconds: -1\n", "agent.interval_seconds"),
    ("agent:\n  interval_seconds: fast\n", "agent.interval_seconds"),
    ("cpuset:\n  reserved_cpus: 'x-y'\n", "cpuset.reserved_cpus"),
    ("resctrl:\n  rdt: maybe\n", "resctrl.rdt"),
    ("discovery:\n  globs: 'a/*'\n", "discovery.globs"),
    ("nodes:\n  other:\n    agent: {bogus: 1}\n", "agent.bogus"),
])
def test_bad_values_are_rejected_with_key_path(text, path):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml", node="n1")
    assert path in str(e.value)


def test_yaml_syntax_error_says_where():
    with pytest.raises(ConfigError) as e:
        parse_config("agent: [\n", source="c.yaml", node="n1")
    assert "line" in str(e.value)


def test_node_override_applies_only_to_that_node():
    text = "rebalancer:\n  margin: 0.1\nnodes:\n  big:\n    rebalancer:\n      margin: 0.5\n"
    assert parse_config(text, source="c", node="big").rebalancer.margin == 0.5
    assert parse_config(text, source="c", node="small").rebalancer.margin == 0.1


def test_watcher_reloads_on_symlink_swap_and_rejects_invalid(tmp_path):
    (tmp_path / "v1").mkdir(); (tmp_path / "v2").mkdir(); (tmp_path / "v3").mkdir()
    (tmp_path / "v1" / "c.yaml").write_text("rebalancer: {margin: 0.1}\n")
    (tmp_path / "v2" / "c.yaml").write_text("rebalancer: {margin: 0.2}\n")
    (tmp_path / "v3" / "c.yaml").write_text("rebalancer: {margin: nope}\n")
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "c.yaml").symlink_to("..data/c.yaml")
    path = str(tmp_path / "c.yaml")
    w = ConfigWatcher(path, node="n")
    assert load_config(path, node="n").rebalancer.margin == 0.1
    assert w.poll() is None
    (tmp_path / "..tmp").symlink_to("v2"); (tmp_path / "..tmp").rename(tmp_path / "..data")
    assert w.poll().rebalancer.margin == 0.2
    (tmp_path / "..tmp").symlink_to("v3"); (tmp_path / "..tmp").rename(tmp_path / "..data")
    with pytest.raises(ConfigError):
        w.poll()
    assert w.poll() is None  # reported once, not on every poll


def test_watcher_reads_a_file_written_in_place_only_once_it_stopped_changing(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rebalancer: {margin: 0.1}\n")
    w = ConfigWatcher(str(path), node="n")
    with open(path, "w") as f:  # in place, same inode: a write caught half done is a valid YAML
        f.write("rebalancer: {}\n")
        f.flush()
        assert w.poll() is None  # changed, not read yet
        f.seek(0)
        f.truncate()
        f.write("rebalancer: {margin: 0.3}\n")
    assert w.poll() is None  # changed again since the last poll: still settling
    assert w.poll().rebalancer.margin == 0.3  # unchanged across two polls: read, and whole
    assert w.poll() is None
    other = tmp_path / "new.yaml"  # control: replaced whole (a new inode) is read at once
    other.write_text("rebalancer: {margin: 0.4}\n")
    other.rename(path)
    assert w.poll().rebalancer.margin == 0.4


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(e.value)


@pytest.mark.parametrize("text,want", [("resctrl:\n  rdt: on\n", "on"), ("resctrl:\n  rdt: off\n", "off"),
                                       ("resctrl:\n  rdt: 'on'\n", "on"), ("kubernetes:\n  api: off\n", "off")])
def test_bare_yaml_on_off_mean_the_words(text, want):
    cfg = parse_config(text, source="c.yaml", node="n")
    assert (cfg.resctrl.rdt if "rdt" in text else cfg.kubernetes.api) == want


def test_a_bool_is_not_accepted_where_on_off_is_not_a_choice():
    with pytest.raises(ConfigError):
        parse_config("agent:\n  log_level: on\n", source="c.yaml", node="n")


@pytest.mark.parametrize("text", ["vm: {vmm_overhead_mcpu: 250}\n", "rebalancer: {vm_overhead_mcpu: 250}\n",
                                  "vm: {vmm_overhead_mcpu: 250}\nrebalancer: {vm_overhead_mcpu: 250}\n"])
def test_vmm_overhead_is_one_setting_for_actuator_and_planner(text):
    cfg = parse_config(text, source="c.yaml", node="n")
    assert cfg.vm.vmm_overhead_mcpu == cfg.rebalancer.vm_overhead_mcpu == 250


def test_conflicting_vmm_overheads_are_an_error():
    with pytest.raises(ConfigError) as e:
        parse_config("vm: {vmm_overhead_mcpu: 250}\nrebalancer: {vm_overhead_mcpu: 100}\n", source="c.yaml", node="n")
    assert "vm_overhead_mcpu" in str(e.value) and "250" in str(e.value)


@pytest.mark.parametrize("text,path,name", [
    ("resctrl:\n  classes: {\"gold\\n\": {l3: '50%'}}\n", "resctrl.classes", "gold\n"),
    ("resctrl:\n  group_prefix: \"perfbalance.\\n\"\n", "resctrl.group_prefix", "perfbalance.\n"),
    ("rebalancer:\n  rdt_aggressor_class: \"squeeze\\n\"\n", "rebalancer.rdt_aggressor_class", "squeeze\n"),
])
def test_a_name_with_a_trailing_newline_is_refused(text, path, name):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml", node="n")
    assert (e.value.source, e.value.path) == ("c.yaml", path)
    assert f"{name!r} is not allowed: it contains control characters" in str(e.value)


@pytest.mark.parametrize("section", [BlockIoSection, RtSection])
def test_a_class_name_with_a_trailing_newline_is_refused(section):
    with pytest.raises(ConfigError) as e:
        build(section, {"classes": {"gold\n": {}}}, source="c.yaml", path="classes")
    assert e.value.path == "classes.classes" and "control characters" in str(e.value)


@pytest.mark.parametrize("rule,name", [(CLASS, "gold\n"), (GROUP_PREFIX, "perfbalance.\n"), (PATH_ELEMENT, "pod\n"),
                                       (LABEL_VALUE, "gold\n"), (C_IDENTIFIER, "PB_X\n"), (QUALIFIED_NAME, "a/b\n")])
def test_every_name_rule_refuses_a_trailing_newline(rule, name):
    assert name_problem(name.rstrip("\n"), rule) is None
    assert name_problem(name, rule) is not None


@pytest.mark.parametrize("value", ["../../tmp/x", "a/b", "..", "-x"])
def test_rdt_aggressor_class_must_be_a_name(value):
    with pytest.raises(ConfigError) as e:
        parse_config(f"rebalancer:\n  rdt_aggressor_class: {value!r}\n", source="c.yaml", node="n")
    assert e.value.source == "c.yaml" and e.value.path == "rebalancer.rdt_aggressor_class"
    assert e.value.value == value


def test_rdt_aggressor_class_must_be_a_configured_class():
    text = "resctrl:\n  classes: {gold: {l3: '50%'}, squeeze: {l3: '10%'}}\nrebalancer:\n  rdt_aggressor_class: bronze\n"
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml", node="n")
    assert (e.value.source, e.value.path, e.value.value) == ("c.yaml", "rebalancer.rdt_aggressor_class", "bronze")
    assert "gold, squeeze" in str(e.value)
    ok = parse_config(text.replace("bronze", "squeeze"), source="c.yaml", node="n")
    assert ok.rebalancer.rdt_aggressor_class == "squeeze"


def test_rdt_aggressor_class_in_partitions_and_node_overrides_is_checked():
    text = ("resctrl:\n  partitions: {p: {l3: '80%', classes: {squeeze: {l3: '10%'}}}}\n"
            "nodes:\n  other:\n    rebalancer: {rdt_aggressor_class: gold}\n")
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="c.yaml", node="n")
    assert e.value.path == "rebalancer.rdt_aggressor_class" and e.value.value == "gold"
