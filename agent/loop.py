"""The agent loop: collect -> Snapshot -> plan -> act -> report, once per interval.

One asyncio task runs the cycles; the blocking parts of a cycle (reading cgroups, BPF maps,
writing cpusets) run in a worker thread so the HTTP server and the MQTT publisher stay
responsive. Everything that can fail per container or per collector is caught at its boundary
and recorded in the cycle's `errors`; the loop itself only stops on SIGTERM/SIGINT or after
`--cycles N`, and then detaches BPF programs and closes what it opened within a bounded grace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from agent.act.dispatch import Backoff, kind_of
from agent.config import AgentSection, Config, ConfigWatcher
from agent.export.report import AgentState, Applied, CycleReport, Realized, reason_code
from agent.export.services import Services, start_services
from agent.persist.checkpoint import Checkpoint, CheckpointError, planner_seed, recover, write_atomic
from agent.persist.instance import reconfigure_logging
from agent.plan.runner import PolicyRunner
from agent.wiring import Parts, build_parts
from perfbalance.errors import ConfigError, ContainerGone, PerfbalanceError
from perfbalance.model import Action, Container, ContainerSample, KubeletState, Plan, Snapshot
from perfbalance.sandbox import VcpuPinning
from rebalancer.policy import PolicyError

log = logging.getLogger("perfbalance.loop")

SHUTDOWN_GRACE_SECONDS = 10.0
CONFIG_STATUS_FILE = "config-status.json"


@dataclass
class CycleInputs:
    """What a cycle needs from the previous one (the policies' own states are in the PolicyRunner)."""

    cycle: int = 0
    last_time: float = 0.0
    decisions: dict[str, list[Applied]] = field(default_factory=dict)  # planner decision -> its events
    backoff: Backoff = field(default_factory=Backoff)  # containers whose last action failed
    vcpu_pinning: tuple[VcpuPinning, ...] = ()  # the last plan's: the stable host CPU <-> vCPU mapping


class Agent:
    """One perfbalance agent on one node."""

    def __init__(self, config: Config, *, node: str, config_path: str | None = None,
                 dry_run: bool = False, cycles: int | None = None, json_out: TextIO | None = None,
                 parts_factory: Callable[..., Parts] = build_parts,
                 overrides: Callable[[Config], Config] | None = None) -> None:
        """`overrides` (e.g. from command-line flags) is applied to the config and to every
        reloaded one, so that a reload does not undo `--interval`."""
        self._overrides = overrides or (lambda c: c)
        config = self._overrides(config)
        self.config, self.node, self.config_path = config, node, config_path
        self._dry_run_flag = dry_run  # --dry-run outlives reloads, like the other flags
        self.dry_run = dry_run or config.agent.dry_run
        self.cycles, self.json_out = cycles, json_out
        self.state = AgentState(node=node)
        self.state.config_loaded_time = time.time()
        self._parts_factory = parts_factory
        self._watcher = ConfigWatcher(config_path, node=node) if config_path else None
        self._stop = asyncio.Event()
        self._inputs = CycleInputs()
        self._planner = PolicyRunner()
        self.parts: Parts | None = None
        self.checkpoint: Checkpoint | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests)
                pass
        self.parts = await asyncio.to_thread(self._parts_factory, self.config, self.node,
                                             self.config_path or "embedded defaults")
        self.parts.start()
        self._write_config_status()
        services = await start_services(self.state, self.config)
        try:
            await asyncio.to_thread(self._prime)
            await self._cycles(services)
        finally:
            await self._shutdown(services)
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
        return 0

    async def _cycles(self, services: Services) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            if self.cycles is not None and self._inputs.cycle >= self.cycles:
                break
            # Fixed rate: the window is the interval (re-read: a reload may change it), not
            # the interval plus however long the last cycle took.
            interval = self.config.agent.interval_seconds
            if await self._sleep(max(0.0, interval - (time.monotonic() - started))):
                break
            started = time.monotonic()
            try:
                report = await asyncio.to_thread(self.cycle_once)
            except Exception as e:  # a bug in one cycle must not take the node's agent down
                log.exception("cycle %d failed; the agent keeps its last good state", self._inputs.cycle + 1)
                with self.state.lock:
                    self.state.collector_errors_total["cycle"] += 1
                if self.state.latest is None:
                    continue
                report = replace(self.state.latest, applied=(), realized=(),
                                 errors=(f"cycle failed: {type(e).__name__}: {e}",))
            self.state.publish(report)
            services.publish(report, self.config)
            await asyncio.to_thread(services.prerender)
            if self.json_out is not None:
                self.json_out.write(json.dumps(report.to_json(), sort_keys=False) + "\n")
                self.json_out.flush()
            log.debug("cycle %d took %.3fs", report.cycle, time.monotonic() - started)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, returning True when a stop was requested meanwhile."""
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _shutdown(self, services: Services) -> None:
        assert self.parts is not None
        try:
            await asyncio.wait_for(services.stop(), SHUTDOWN_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("services did not stop within %.0fs", SHUTDOWN_GRACE_SECONDS)
        await asyncio.to_thread(self.parts.close)
        log.info("stopped: BPF programs detached, state left consistent")

    # -- one cycle (worker thread) -------------------------------------------------------
    def _prime(self) -> None:
        """Recover from the checkpoint, open collectors and take a first reading so that cycle 1
        has a full window of rates."""
        assert self.parts is not None
        containers, kubelet = self.parts.discover([])
        if not self.dry_run:
            self._recover(containers, kubelet)
        self.parts.collect(containers, time.time())
        self._inputs.last_time = time.time()

    def _recover(self, containers: Sequence[Container], kubelet: KubeletState) -> None:
        """After a restart (SIGKILL included): finish or revert half-done moves, take back our
        placements (cpusets for drift detection, the planner's RDT classes so the sweep keeps
        them) and carry dwell times and cooldowns over, so nothing already placed is moved again."""
        assert self.parts is not None
        ck = self.checkpoint = Checkpoint(self.config.agent.run_dir, node=self.node)
        data = ck.load()
        if data is None:
            return
        usable = self.parts.topology.online - self.parts.unusable_cpus()
        by_id = {c.id: c for c in containers}
        for step in recover(data, containers, kubelet=kubelet, usable_cpus=usable):
            ok = False
            if step.action in ("finish", "revert") and step.container in by_id:
                action = Action(kind=step.kind, container=step.container, frm="", to=step.value,
                                mems=step.mems, reason=f"recovery: {step.action} ({step.reason})")
                try:
                    self.parts.apply(action, by_id[step.container])
                    ok = step.action == "finish"
                except PerfbalanceError as e:
                    log.warning("recovery of %s failed: %s", step.container, e)
            log.info("recovery: %s %s %s -> %s (%s)", step.action, step.kind, step.container,
                     step.value or "-", step.reason)
            self._checkpoint(lambda ck: ck.end_move(step.container, ok=ok, kind=step.kind))
        adopted = self.parts.cpusets.adopt(ck.cpuset_placements())
        classes = self.parts.resctrl.adopt(ck.class_placements(), containers)
        policy = self.config.rebalancer.policy
        try:
            self._planner.resume(policy, planner_seed(data, containers, time.time()))
        except PolicyError as e:
            log.error("restart: dwell times and cooldowns not carried over: %s", e)
        log.info("restart: %d placement(s) of the previous run adopted, and %d RDT class choice(s) of its planner",
                 adopted, classes)

    def _checkpoint(self, record: Callable[[Checkpoint], None], errors: list[str] | None = None) -> None:
        """Record an intention; a failing write is reported, the cycle goes on."""
        if self.checkpoint is None or self.dry_run:
            return
        try:
            record(self.checkpoint)
        except CheckpointError as e:
            log.error("checkpoint: %s", e)
            if errors is not None:
                errors.append(f"checkpoint: {e}")

    def cycle_once(self) -> CycleReport:
        assert self.parts is not None
        errors: list[str] = []
        self._maybe_reload(errors)
        now = time.time()
        containers, kubelet = self.parts.discover(errors)
        ids = {c.id for c in containers}
        self._checkpoint(lambda ck: ck.retain(ids), errors)
        self._inputs.backoff.retain(ids)
        t0 = time.perf_counter()
        metrics = self.parts.collect(containers, now)
        errors.extend(self.parts.collector_errors())
        collect_seconds = time.perf_counter() - t0
        snapshot = self._snapshot(now, containers, kubelet, metrics)
        t1 = time.perf_counter()
        plan = self._pin_vcpus(snapshot, self._plan(snapshot, now, errors))
        plan_seconds = time.perf_counter() - t1
        applied = () if self.dry_run else self._act(plan.actions, snapshot, errors)
        if not self.dry_run:
            errors.extend(self.parts.maintain(snapshot, self.state, plan.vcpu_pinning))
        realized = self._realized(plan)
        self._inputs.cycle += 1
        self._inputs.last_time = now
        return CycleReport(
            cycle=self._inputs.cycle, time=now, snapshot=snapshot, plan=plan,
            applied=tuple(applied), realized=realized, errors=tuple(errors),
            plan_seconds=plan_seconds, collect_seconds=collect_seconds,
            vcpu_map=self.parts.vcpu_map(), vcpu_pinning=self.parts.vcpu_pinning(),
            classes=self.parts.class_report(snapshot),
            actuation=self.parts.actuation(),
        )

    def _maybe_reload(self, errors: list[str]) -> None:
        if self._watcher is None:
            return
        try:
            new = self._watcher.poll()
        except ConfigError as e:
            with self.state.lock:
                self.state.config_valid, self.state.config_error = False, str(e)
                self.state.config_reloads_total["invalid"] += 1
            errors.append(f"config rejected, last good one stays in force: {e}")
            log.error("config rejected, last good one stays in force: %s", e)
            self._write_config_status()
            return
        if new is None:
            return
        assert self.parts is not None
        new = self._overrides(new)
        old, self.config = self.config, new
        self._reconfigure_agent(old.agent, new.agent)
        self.parts.reconfigure(new)
        with self.state.lock:
            self.state.config_valid, self.state.config_error = True, ""
            self.state.config_reloads_total["ok"] += 1
            self.state.config_loaded_time = time.time()
        log.info("config reloaded from %s", self.config_path)
        self._write_config_status()

    def _reconfigure_agent(self, old: AgentSection, new: AgentSection) -> None:
        """The `agent:` section of a reloaded config: dry_run and logging at once (the interval is
        read every cycle); the run directory holds the lock and checkpoint, bound at start."""
        dry_run = self._dry_run_flag or new.dry_run
        if dry_run != self.dry_run:
            log.warning("dry_run %s by the reloaded config", "on: planning only" if dry_run else "off: acting again")
            self.dry_run = dry_run
        if (new.log_level, new.log_format) != (old.log_level, old.log_format):
            reconfigure_logging(new.log_level, new.log_format)
            log.info("logging: level %s, format %s", new.log_level, new.log_format)
        if new.run_dir != old.run_dir:
            log.warning("config changes in agent.run_dir take effect at the next start of the agent")

    def _write_config_status(self) -> None:
        """<run_dir>/config-status.json: what `perfbalance doctor` shows of the running agent's
        configuration (written on change only)."""
        with self.state.lock:
            status = {"pid": os.getpid(), "node": self.node, "path": self.config_path or "",
                      "valid": self.state.config_valid, "error": self.state.config_error,
                      "loaded_time": self.state.config_loaded_time, "time": time.time()}
        try:
            write_atomic(os.path.join(self.config.agent.run_dir, CONFIG_STATUS_FILE), json.dumps(status))
        except OSError as e:
            log.warning("cannot write %s in %s: %s", CONFIG_STATUS_FILE, self.config.agent.run_dir, e.strerror)

    def _snapshot(self, now: float, containers: Sequence[Container], kubelet: Any,
                  metrics: dict[str, dict[str, float]]) -> Snapshot:
        assert self.parts is not None
        samples = tuple(ContainerSample(container=c, metrics=metrics.get(c.id, {}))
                        for c in containers)
        return Snapshot(
            time=now, window=max(0.0, now - self._inputs.last_time), node=self.node,
            topology=self.parts.topology, containers=samples, kubelet=kubelet,
            reserved=self.parts.unusable_cpus(), collectors=self.parts.collector_status(),
            node_metrics=self.parts.node_metrics(), cycle=self._inputs.cycle + 1,
            vmms=self.parts.vmms(),
        )

    def _plan(self, snapshot: Snapshot, now: float, errors: list[str]) -> Plan:
        """The configured policy's plan (rebalancer.policy, within its time budget); on a failure
        no moves and the policy keeps its last good state."""
        rebalancer = self.config.rebalancer
        if not rebalancer.enabled:
            return Plan(time=now, state=self._planner.state(rebalancer.policy))
        outcome = self._planner.run(snapshot, rebalancer, now)
        if outcome.error:
            errors.append(f"planner: {outcome.error}")
            return outcome.plan
        state = outcome.plan.state
        if state is not None:
            self._checkpoint(lambda ck: ck.set_cooldowns(state.cooldown_until), errors)
        return outcome.plan

    def _pin_vcpus(self, snapshot: Snapshot, plan: Plan) -> Plan:
        """The VM sandboxes' thread pinning after the plan's moves, whatever the policy (pure:
        rebalancer.vm); the last cycle's pinning is what keeps each host CPU on its vCPU."""
        from rebalancer.vm import plan_vcpus

        vm = self.config.vm
        pinning = plan_vcpus(snapshot, actions=plan.actions, previous=self._inputs.vcpu_pinning,
                             system_vcpus=vm.system_vcpus, pin_exclusive=vm.pin_exclusive)
        self._inputs.vcpu_pinning = pinning
        return replace(plan, vcpu_pinning=pinning)

    def _act(self, actions: Sequence[Action], snapshot: Snapshot, errors: list[str]) -> list[Applied]:
        assert self.parts is not None
        by_id = {s.id: s.container for s in snapshot.containers}
        out: list[Applied] = []
        for action in actions:
            event = Applied(event_id=uuid.uuid4().hex, kind=action.kind, container=action.container,
                            frm=action.frm, to=action.to, reason=action.reason, ok=False,
                            predicted_benefit=action.benefit, predicted_cost=action.cost,
                            time=time.time())
            container = by_id.get(action.container)
            waiting = self._inputs.backoff.waiting(action.container, event.time)
            if waiting:
                errors.append(f"{action.kind} of {action.container} to {action.to} skipped: {waiting}")
                continue
            kind = kind_of(action)
            try:
                if container is None:
                    raise ContainerGone(action.container, "not in this cycle's snapshot")
                self._checkpoint(lambda ck: ck.begin_move(container.id, container.cgroup, action.frm, action.to,
                                                          kind, mems=action.mems, event_id=event.event_id), errors)
                path = self.parts.apply(action, container)
                event = replace(event, ok=True, path=path or "")
                self._count(action)
                self._inputs.backoff.succeeded(action.container)
                if action.decision and action.kind != "rollback":  # judged later by its id
                    self._inputs.decisions.setdefault(action.decision, []).append(event)
            except ContainerGone as e:
                event = replace(event, error=str(e))
                errors.append(str(e))
            except PerfbalanceError as e:
                event = replace(event, error=str(e))
                errors.append(str(e))
                self._inputs.backoff.failed(action.container, event.time)
                with self.state.lock:
                    self.state.action_errors_total[type(e).__name__] += 1
            if container is not None:
                self._checkpoint(lambda ck: ck.end_move(container.id, ok=event.ok, kind=kind), errors)
            out.append(event)
        return out

    def _count(self, action: Action) -> None:
        with self.state.lock:
            self.state.moves_total[(action.kind, reason_code(action.reason))] += 1
            if action.kind == "rollback":
                self.state.rollbacks_total += 1

    def _realized(self, plan: Plan) -> tuple[Realized, ...]:
        """The planner's judgement of earlier moves, tied back to the events that made them.

        The planner judges a decision (which may have moved several containers) after it has
        settled (`plan.judgements`); `_act` remembers the applied events of each decision id
        (`Action.decision`).
        """
        out = []
        for j in plan.judgements:
            if j.realized is None:
                continue
            events = self._inputs.decisions.pop(j.decision, [])
            for ev in events or [None]:
                out.append(Realized(event_id=ev.event_id if ev else "", container=ev.container if ev else "",
                                    predicted=j.predicted or 0.0, realized=j.realized,
                                    rolled_back=j.rolled_back))
        if len(self._inputs.decisions) > 1000:  # decisions never evaluated (containers gone)
            for k in sorted(self._inputs.decisions)[:-1000]:
                del self._inputs.decisions[k]
        if out:
            with self.state.lock:
                self.state.realized = (self.state.realized + out)[-100:]
        return tuple(out)

