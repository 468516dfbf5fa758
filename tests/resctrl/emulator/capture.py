"""Write plain captured trees of each emulator variant to tests/data/resctrl/<variant>/.

The trees hold what discovery reads: info/**, the root schemata, empty mon_data/mon_L3_<id>
directories and a procfs `mounts` file. They are regenerated with
`.venv/bin/python tests/resctrl/emulator/capture.py` (needs FUSE) and used by the pure parsing
tests, which then need neither FUSE nor root.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator import VARIANTS, Emulator  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "resctrl"


def capture(name: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="pbcapture-"))
    emu = Emulator(base, name).start()
    try:
        out = DATA / name
        shutil.rmtree(out, ignore_errors=True)
        for dirpath, dirnames, filenames in os.walk(emu.mount / "info"):
            rel = Path(dirpath).relative_to(emu.mount)
            (out / rel).mkdir(parents=True, exist_ok=True)
            for f in filenames:
                (out / rel / f).write_text((Path(dirpath) / f).read_text())
        if (emu.mount / "schemata").exists():
            (out / "schemata").write_text((emu.mount / "schemata").read_text())
        if (emu.mount / "mon_data").exists():
            for d in os.listdir(emu.mount / "mon_data"):
                (out / "mon_data" / d).mkdir(parents=True, exist_ok=True)
                (out / "mon_data" / d / ".keep").write_text("")
        opts = ",".join(["rw", "relatime", *emu.hw.options])
        (out / "mounts").write_text(f"resctrl /sys/fs/resctrl resctrl {opts} 0 0\n")
    finally:
        emu.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    for variant in sys.argv[1:] or sorted(VARIANTS):
        capture(variant)
        print("captured", variant)
