"""A stand-in VMM for the tests: a process whose threads name themselves like a real VMM's.

Run as `python standin_vmm.py <main name> <thread name>...`. Every thread sets its name with
prctl(PR_SET_NAME) (what QEMU and Cloud Hypervisor do for their vCPU and I/O threads), then the
process prints one JSON line {name: tid} and sleeps until its stdin closes. No thread uses CPU.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading

PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def set_name(name: str) -> None:
    if _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_NAME, {name!r})")


def main() -> int:
    main_name, names = sys.argv[1], sys.argv[2:]
    stop = threading.Event()
    tids: dict[str, int] = {}
    ready = threading.Barrier(len(names) + 1)

    def worker(name: str) -> None:
        set_name(name)
        tids[name] = threading.get_native_id()
        ready.wait()
        stop.wait()

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    ready.wait()
    set_name(main_name)
    tids[main_name] = threading.get_native_id()
    print(json.dumps(tids), flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
