"""After bcc compiles, the heap clang/LLVM freed goes back to the kernel (glibc malloc_trim)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from collectors.bpfenv.memory import droppable, parse_smaps, release_freed_heap

CHILD = """
import json, sys
import bpf
from collectors.bpfenv import loader
from perfbalance.host import HostPaths
if sys.argv[1] == "keep":  # control: memory as glibc and the compiler leave it
    loader.release_freed_heap = lambda: False
    loader.release_compiler_pages = lambda procfs: 0
env = loader.prepare(HostPaths(run_dir=sys.argv[2]))
progs = [env.load(bpf.render(name, {})) for name in ("avx512", "pmu")]
kb = {l.split()[0]: int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.split()[0] in ("Rss:", "Anonymous:")}
print(json.dumps({"anonymous_kb": kb["Anonymous:"], "rss_kb": kb["Rss:"]}))
"""


def memory_kb(mode: str, run_dir: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, run_dir], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_glibc_can_release_the_heap() -> None:
    assert release_freed_heap() is True


@pytest.mark.root
@pytest.mark.bpf
def test_compiling_programs_leaves_less_memory_with_the_release(run_dir: str) -> None:
    kept, released = memory_kb("keep", run_dir), memory_kb("release", run_dir)
    # measured here: anonymous ~31 vs ~67 MB (the freed heap), RSS ~50 vs ~155 MB (compiler pages)
    assert released["anonymous_kb"] < kept["anonymous_kb"] - 10 * 1024, (kept, released)
    assert released["rss_kb"] < kept["rss_kb"] - 40 * 1024, (kept, released)


SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fe:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:               1024 kB
Rss:                 900 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000100000-7f0000400000 r-xp 00100000 fe:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                3000 kB
Shared_Dirty:          0 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000400000-7f0000500000 r--p 00400000 fe:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                1024 kB
Private_Dirty:       512 kB
Anonymous:           512 kB
7f0000500000-7f0000510000 rw-p 00500000 fe:01 123 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                  64 kB
Anonymous:            64 kB
7f0000600000-7f0000700000 r-xp 00000000 fe:01 124 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 800 kB
Anonymous:             0 kB
7f0000800000-7f0000900000 rw-p 00000000 00:00 0
Rss:                1000 kB
Anonymous:          1000 kB
"""


def test_smaps_mappings_parse_with_their_resident_and_private_sizes() -> None:
    maps = parse_smaps(SMAPS)
    assert [(m.perms, m.rss_kb, m.anonymous_kb) for m in maps][:3] == [("r--p", 900, 0), ("r-xp", 3000, 0), ("r--p", 1024, 512)]
    assert maps[0].start == 0x7f0000000000 and maps[0].end == 0x7f0000100000 and maps[-1].path == ""


def test_only_clean_file_pages_of_the_compiler_are_dropped() -> None:
    got = droppable(parse_smaps(SMAPS))
    # text and rodata straight from the file; never the relocated (RELRO: private copies) part,
    # the writable data, another library, or anonymous memory
    assert [(m.start, m.perms) for m in got] == [(0x7f0000000000, "r--p"), (0x7f0000100000, "r-xp")]


@pytest.mark.root
@pytest.mark.bpf
def test_a_program_compiles_and_runs_after_the_compiler_pages_were_released(run_dir: str) -> None:
    import bpf
    from collectors.bpfenv.loader import prepare
    from perfbalance.host import HostPaths

    env = prepare(HostPaths(run_dir=run_dir))
    first = env.load(bpf.render("avx512", {}))  # releases the pages after compiling
    second = env.load(bpf.render("pmu", {}))  # the compiler faults its pages back in
    assert first.num_open_tracepoints() == 1
    assert second.num_open_tracepoints() == len(bpf.PROGRAMS["pmu"].tracepoints)  # switch, fork, cgroup move
    first.cleanup()
    second.cleanup()
