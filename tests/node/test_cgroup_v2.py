"""perfbalance on a real cgroup-v2-only kernel: a throwaway guest (Debian's 6.1 kernel under
virtme-ng, emulated with TCG) runs tests/node/v2guest.py once, which drives discovery, the cpuset
actuator and the BPF collectors against real processes and prints what it saw as JSON.

The guest has the host's root filesystem read-only (9p, copy-on-write overlays), so it runs this
working tree with the venv's python. No systemd runs in it (`vng --systemd` never runs the
script: docs/tested-against.md, "systemd in the cgroup-v2 guest"): the kubelet's systemd-driver
slices are laid out by hand with mkdir in the guest's cgroup2. Emulation, not KVM: this machine's nested KVM boots an
unmodified kernel too slowly.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.node.v2guest import MARK

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT = 900  # TCG: ~20 s to boot, plus bcc compiling three programs (~1 min when loaded)


def kernel() -> str | None:
    images = sorted(glob.glob("/boot/vmlinuz-6.1.0-*-amd64"))
    return images[-1] if images else None


def vng() -> str | None:
    beside = Path(sys.executable).parent / "vng"
    return str(beside) if beside.exists() else shutil.which("vng")


def boot(*guest_args: str) -> tuple[int, dict[str, Any] | None, str]:
    """Boot the guest once running v2guest.py: (exit status, its JSON or None, its output)."""
    image, tool = kernel(), vng()
    if image is None or tool is None:
        why = "no /boot/vmlinuz-6.1.0-*-amd64 (apt-get install linux-image-amd64)" if image is None \
            else "no vng (pip install virtme-ng)"
        print(f"skipping the cgroup-v2 guest: {why}; scripts/setup.sh test installs both")
        pytest.skip(f"{why}; scripts/setup.sh test installs it")
    guest = " ".join([sys.executable, "-m", "tests.node.v2guest", *guest_args])
    env = {**os.environ, "PATH": f"{Path(tool).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    res = subprocess.run([tool, "--disable-kvm", "--run", image, "--cpus", "2", "--memory", "1G",
                          "--exec", guest], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=BOOT_TIMEOUT, stdin=subprocess.DEVNULL)
    output = res.stdout + res.stderr
    lines = [ln[len(MARK):] for ln in res.stdout.splitlines() if ln.startswith(MARK)]
    return res.returncode, (json.loads(lines[-1]) if lines else None), output


@pytest.fixture(scope="module")
def guest() -> dict[str, Any]:
    status, result, output = boot()
    assert result is not None, f"no result from the guest (exit {status}):\n{output[-4000:]}"
    assert not result["errors"], "\n".join(result["errors"])
    assert status == 0, f"guest exited {status}:\n{output[-4000:]}"
    return result


def pod(guest: dict[str, Any], qos: str) -> dict[str, str]:
    return guest["pods"][qos]


def test_a_failing_guest_script_fails_the_boot() -> None:
    status, result, output = boot("--exit", "7")
    assert result == {"control": True}, output[-2000:]
    assert status == 7, output[-2000:]


def test_guest_is_cgroup_v2_only_with_cpuset(guest: dict[str, Any]) -> None:
    env = guest["environment"]
    assert env["kernel"].startswith("6.1.")
    assert {m[2] for m in env["cgroup_mounts"]} == {"cgroup2"}, env["cgroup_mounts"]
    assert "cpuset" in env["controllers"] and env["online"] == "0-1"


@pytest.mark.parametrize("qos", ["burstable", "besteffort", "guaranteed"])
def test_discovery_finds_the_systemd_scope_with_its_id_and_qos(guest: dict[str, Any], qos: str) -> None:
    want = pod(guest, qos)
    found = {c["id"]: c for c in guest["discovery"]}
    c = found[want["id"]]
    assert (c["qos"], c["pod_uid"], c["cgroup"], c["runtime"]) == (qos, want["uid"], want["cgroup"], "containerd")
    assert c["cgroup"].endswith(f"/cri-containerd-{want['id']}.scope")


def test_discovery_reads_the_request_from_cpu_weight(guest: dict[str, Any]) -> None:
    found = {c["id"]: c for c in guest["discovery"]}
    burstable, besteffort = found[pod(guest, "burstable")["id"]], found[pod(guest, "besteffort")["id"]]
    assert 0 < burstable["request_mcpu"], burstable  # cpu.weight 20 was written
    assert burstable["request_mcpu"] != besteffort["request_mcpu"]


def test_an_unmoved_v2_scope_has_an_empty_request_and_inherits_every_cpu(guest: dict[str, Any]) -> None:
    before = guest["move"]["before"]
    assert (before["cpus"], before["effective"], before["allowed"]) == ("", "0-1", "0-1")


def test_actuator_move_shows_in_cpus_allowed_of_the_process_and_later_forks(guest: dict[str, Any]) -> None:
    m = guest["move"]
    assert m["changed"] and (m["scope_cpus"], m["scope_effective"], m["scope_mems"]) == ("1", "1", "0")
    assert m["allowed_main"] == "1"
    later = {pid: cpus for pid, cpus in m["allowed_forked_later"].items() if cpus != "gone"}
    assert later and set(later.values()) == {"1"}, m["allowed_forked_later"]


def test_actuator_writes_only_the_scope_the_parent_slice_keeps_inheriting(guest: dict[str, Any]) -> None:
    m = guest["move"]
    scope = pod(guest, "burstable")["cgroup"]
    assert all(w.startswith(f"{scope}/") for w in m["writes"]), m["writes"]
    assert (m["slice_cpus"], m["slice_effective"]) == ("", "0-1")


def test_v2_parent_shrink_under_a_child_is_accepted_and_the_child_falls_back(guest: dict[str, Any]) -> None:
    s = guest["v2_semantics"]["parent_shrunk"]
    # v1 refuses this write (EBUSY); v2 keeps the child's request and its effective set follows
    # the parent's (Documentation/admin-guide/cgroup-v2.rst, cpuset.cpus.effective)
    assert (s["slice_effective"], s["scope_cpus"], s["scope_effective"], s["allowed_main"]) == ("0", "1", "0", "0")


def test_actuator_sees_the_fallback_as_drift_and_none_once_restored(guest: dict[str, Any]) -> None:
    v2 = guest["v2_semantics"]
    assert v2["drift"] == [{"id": pod(guest, "burstable")["id"], "applied": "1", "seen": "0"}]
    restored = v2["parent_restored"]
    assert (restored["scope_effective"], restored["allowed_main"], restored["drift"]) == ("1", "1", 0)


def test_a_populated_v2_cgroup_cannot_go_back_to_an_empty_cpuset(guest: dict[str, Any]) -> None:
    # validate_change(): a cpuset with tasks (here below it) cannot get an empty cpus_allowed;
    # the actuator never writes an empty set (it refuses one before writing)
    assert guest["v2_semantics"]["parent_emptied"] == "ENOSPC"


def test_kernel_refuses_a_cpu_that_does_not_exist(guest: dict[str, Any]) -> None:
    v2 = guest["v2_semantics"]
    assert v2["nonexistent_cpu"] in ("ERANGE", "EINVAL") and v2["after_refusal"] == "1"


def test_bpf_compiles_against_the_guest_kernel_with_cgroup_id_keys(guest: dict[str, Any]) -> None:
    col = guest["collectors"]
    assert col["bpf"]["available"], col["bpf"]["reason"]
    assert col["bpf"]["cgroup_keys"] is True  # v2: keys are cgroup ids, not pids
    for name in ("avx512", "runqlat"):
        assert col[name]["up"] and col[name]["detail"].get("source", "bpf") == "bpf", col[name]


def test_avx512_collector_loads_and_says_what_the_guest_cpu_offers(guest: dict[str, Any]) -> None:
    col, has_avx512 = guest["collectors"], guest["environment"]["avx512f"]
    assert col["avx512"]["up"] and col["avx512"]["detail"]["keys"] == "cgroup_id", col["avx512"]
    numpy = col["avx512"]["metrics"]["guaranteed"]
    if has_avx512:
        assert numpy["avx512_heavy"] == 1.0, numpy
    else:  # TCG's CPU model has no AVX-512: doctor says so and the numpy loop is not heavy
        assert not col["doctor_avx512"]["available"], col["doctor_avx512"]
        assert "no AVX-512" in col["doctor_avx512"]["reason"], col["doctor_avx512"]
        assert numpy["avx512_heavy"] == 0.0 and numpy["avx512_switches_per_second"] == 0.0, numpy


def test_perf_collector_counts_the_busy_container(guest: dict[str, Any]) -> None:
    perf = guest["collectors"]["perf"]
    assert perf["up"], perf["reason"]
    busy, idle = perf["metrics"]["guaranteed"], perf["metrics"]["besteffort"]
    assert busy and any(v > 0 for v in busy.values()), perf
    assert busy != idle


def test_runqlat_collector_measures_the_forking_container(guest: dict[str, Any]) -> None:
    rq = guest["collectors"]["runqlat"]
    assert rq["up"], rq["reason"]
    assert rq["metrics"]["burstable"], rq
    # Debian's 6.1 kernel has BTF and CONFIG_SCHED_INFO: the sched_info method loads there too
    # (its offsets from that kernel's BTF, its loads checked by that kernel's verifier)
    assert rq["detail"]["method"] == "sched_info", rq["detail"]
