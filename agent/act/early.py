"""Classes of a container just started, applied at once instead of at the agent's next cycle.

With NRI the runtime tells the plugin when a container starts (StartContainer). That arrives on
the session's reader thread, which must answer within the runtime's request timeout and must not
touch the class state the agent's cycle uses. So the hand-off only queues the container id for
one worker thread here; the worker finds the container (`find`: discovery of the cgroup tree,
names and annotations from the NRI view) and applies its classes through `ClassNode.admit`,
under the node's lock, so never while a cycle syncs classes. The reader thread waits for that at
most `wait` seconds: usually the container is in its classes before the runtime lets it run, and
the runtime never waits long. Problems are logged and handed to the next cycle's report.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from agent.act.classnode import ClassNode
from perfbalance.errors import ParseError, PerfbalanceError
from perfbalance.model import Container

log = logging.getLogger("perfbalance.classes")
FIND_ATTEMPTS = 5  # the container's cgroup not found yet: tried again FIND_RETRY_SECONDS later
FIND_RETRY_SECONDS = 0.1
STOP = ""


class EarlyClasses:
    """One worker thread applying the classes of containers the runtime reports started."""

    def __init__(self, node: ClassNode, find: Callable[[str], Container | None], *,
                 enabled: Callable[[], bool], wait: float = 0.5) -> None:
        self._node, self._find, self._enabled, self._wait = node, find, enabled, wait
        self._queue: queue.Queue[tuple[str, threading.Event]] = queue.Queue()
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._thread: threading.Thread | None = None
        self.counters = {"admitted_total": 0, "not_found_total": 0}

    def start(self) -> None:
        if self._thread is None and self._node.manager.slots:
            self._thread = threading.Thread(target=self._run, name="early-classes", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._queue.put((STOP, threading.Event()))
            self._thread.join(timeout)
            self._thread = None

    def started(self, container_id: str) -> bool:
        """From the NRI reader thread: a container started. True when its classes were applied
        within `wait` (False: not in use, off in dry-run, or still being applied)."""
        if self._thread is None or not self._enabled():
            return False
        done = threading.Event()
        self._queue.put((container_id, done))
        return done.wait(self._wait)

    def drain(self) -> list[str]:
        """Problems met since the last call (for the cycle's report)."""
        with self._lock:
            out, self._errors = self._errors, []
        return out

    def _run(self) -> None:
        while True:
            cid, done = self._queue.get()
            if cid == STOP:
                return
            try:
                self._one(cid)
            except Exception as e:  # a bug here must not end the worker: the next cycle applies it
                log.exception("classes of started container %s", cid[:12])
                self._note(f"classes of started container {cid[:12]}: {type(e).__name__}: {e}")
            finally:
                done.set()

    def _one(self, cid: str) -> None:
        for attempt in range(FIND_ATTEMPTS):
            try:
                c = self._find(cid)
            except (ParseError, PerfbalanceError) as e:
                self._note(f"classes of started container {cid[:12]}: discovery failed: {e}")
                return
            if c is not None:
                errors = self._node.admit([c])
                with self._lock:
                    self._errors += errors
                    self.counters["admitted_total"] += 1
                return
            if attempt + 1 < FIND_ATTEMPTS:
                time.sleep(FIND_RETRY_SECONDS)
        log.info("started container %s not found in the cgroup tree: its classes come with the next cycle",
                 cid[:12])
        with self._lock:
            self.counters["not_found_total"] += 1

    def _note(self, line: str) -> None:
        log.warning("%s", line)
        with self._lock:
            self._errors.append(line)
