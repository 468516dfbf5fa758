// PMU counters per container at a cost independent of the number of containers.
//
// Each event is opened once per CPU (pid=-1, cpu=c) into `pmu_events` at index
// event * PB_NCPU + cpu. At every sched_switch (current == the outgoing task) this CPU's counters
// are read with bpf_perf_event_read_value and the delta since the previous switch on this CPU is
// added to the outgoing task's cgroup, together with the enabled/running time deltas so that
// userspace can correct for multiplexing (scaled = counter * enabled / running). The same path
// runs with software events (task-clock) where no PMU exists.
//
// A switch between two tasks of the same key (cgroup) needs no counter read: the delta since the
// last read belongs to that key whichever of them ran, and is attributed at the next switch where
// the key changes. The incoming task's key is not a tracepoint field (current is the outgoing
// task), so every switch records the outgoing task's key in a direct-mapped array indexed by the
// low bits of its thread id (`pmu_task`, with the id to detect a slot taken by another thread);
// the incoming task's entry, written when it last switched out, names its key. An entry that is
// missing, or taken by another thread, means "read" (never a wrong skip from a collision).
// A wrong "same key" would credit the whole span unread since the last read to the incoming
// task's real key, so entries are made stale at the two events that can make one lie, both rare
// next to switches:
// - sched_process_fork clears the new thread's slot (it may hold an exited thread's entry under
//   the same id; a clone3 CLONE_INTO_CGROUP child starts in another cgroup than its parent);
// - cgroup_attach_task on the v2 hierarchy (dst_root 0, whose ids are the keys; v1 moves and
//   PB_KEY_PID keys change no key) bumps every CPU's epoch (`pmu_cpu`); an entry written under
//   another epoch means "read". The tracepoint fires once per move, naming the thread-group
//   leader only when cgroup.procs moves the whole process (one thread for cgroup.threads), and
//   fields and helpers cannot list a process's threads: so every entry goes stale, and each task
//   that runs afterwards reads once at its next switch-in.
// Left inexact: a moved thread switched in on another CPU within the microseconds between the
// move and the epoch bumps; the span unread there goes to its new cgroup.
// Counter reads are most of this program's cost: each bpf_perf_event_read_value reads the clock
// for the enabled/running times, and a software counter's read path is longer still.
//
// Defines: PB_NEVENTS (1..8), PB_NCPU (possible CPUs), PB_MAX_KEYS, PB_KEY_PID (key by process),
// PB_TASK_BITS (log2 of the pmu_task slots), PB_NO_READS (`bench collect` only: everything but
// the counter reads, to measure their share).

#ifndef PB_NEVENTS
#define PB_NEVENTS 1
#endif
#ifndef PB_NCPU
#define PB_NCPU 1
#endif
#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif
#ifndef PB_TASK_BITS
#define PB_TASK_BITS 16
#endif
#define PB_TASK_SLOTS (1 << PB_TASK_BITS)

struct pmu_reading {
    u64 counter[PB_NEVENTS];
    u64 enabled[PB_NEVENTS];
    u64 running[PB_NEVENTS];
};

BPF_PERF_ARRAY(pmu_events, PB_NEVENTS * PB_NCPU);
BPF_PERCPU_ARRAY(pmu_last, struct pmu_reading, 1);  // this CPU's reading at its previous switch
BPF_HASH(pmu_counts, u64, struct pmu_reading, PB_MAX_KEYS);
BPF_ARRAY(pmu_dropped, u64, 1);

#define PB_NO_TASK 0xffffffff  // a slot no thread wrote (thread ids are below PID_MAX_LIMIT, 2^22)

struct pmu_task {
    u64 key;    // the thread's key when it last switched out
    u32 pid;    // the thread that wrote the slot, or PB_NO_TASK
    u32 epoch;  // the writing CPU's pmu_cpu epoch then
};
BPF_ARRAY(pmu_task, struct pmu_task, PB_TASK_SLOTS);

// Per CPU, in a plain array indexed by CPU so that cgroup_attach_task can bump every CPU's epoch
// (a per-CPU map's other CPUs are out of a program's reach without bpf_map_lookup_percpu_elem,
// which bcc cannot name). 128 bytes: two CPUs' counters never share a cache line.
struct pmu_cpu {
    u64 switches[2];  // [0] switches that read the counters, [1] that skipped
    u32 epoch;        // cgroup moves seen (every CPU's is bumped alike)
    u32 pad;
    u64 pad2[13];
};
BPF_ARRAY(pmu_cpu, struct pmu_cpu, PB_NCPU);

// Record prev's key; true when next was last seen with the same key in this epoch (no read needed).
static __always_inline int pmu_same_key(u32 prev, u32 next, u64 key, u32 epoch) {
    u32 idx = prev & (PB_TASK_SLOTS - 1);
    struct pmu_task *t = pmu_task.lookup(&idx);
    if (t && (t->pid != prev || t->key != key || t->epoch != epoch)) {
        t->key = key;
        t->pid = prev;
        t->epoch = epoch;
    }
    idx = next & (PB_TASK_SLOTS - 1);
    t = pmu_task.lookup(&idx);
    return t && t->pid == next && t->key == key && t->epoch == epoch;
}

// A new thread's slot may hold an exited thread's entry under the same id: no skip into it.
TRACEPOINT_PROBE(sched, sched_process_fork) {
    u32 idx = (u32)args->child_pid & (PB_TASK_SLOTS - 1);
    struct pmu_task *t = pmu_task.lookup(&idx);
    if (t)
        t->pid = PB_NO_TASK;
    return 0;
}

#ifndef PB_KEY_PID
// A task moved to another v2 cgroup: every entry written before is stale (see the header).
TRACEPOINT_PROBE(cgroup, cgroup_attach_task) {
    if (args->dst_root != 0)
        return 0;
    for (u32 cpu = 0; cpu < PB_NCPU; cpu++) {
        u32 idx = cpu;  // the lookup takes an address: a copy, so the verifier keeps cpu's bound
        struct pmu_cpu *c = pmu_cpu.lookup(&idx);
        if (c)
            __sync_fetch_and_add(&c->epoch, 1);
    }
    return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_switch) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    u32 cpu = bpf_get_smp_processor_id();
    struct pmu_cpu *c = pmu_cpu.lookup(&cpu);
    if (!c)
        return 0;
    int skip = pmu_same_key(args->prev_pid, args->next_pid, key, c->epoch);
    c->switches[skip & 1] += 1;
    if (skip)
        return 0;
    int zero_idx = 0;
    struct pmu_reading *last = pmu_last.lookup(&zero_idx);
    if (!last)
        return 0;
    struct pmu_reading zero = {};
    struct pmu_reading *acc = pmu_counts.lookup_or_try_init(&key, &zero);
#pragma unroll
    for (int e = 0; e < PB_NEVENTS; e++) {
        struct bpf_perf_event_value v = {};
#ifdef PB_NO_READS
        v.counter = last->counter[e] + 1;
        v.enabled = last->enabled[e] + 1;
        v.running = last->running[e] + 1;
#else
        if (pmu_events.perf_counter_value(e * PB_NCPU + cpu, &v, sizeof(v)) != 0)
            continue;
#endif
        // The first switch on a CPU only primes the reading (enabled time starts above zero).
        if (acc && last->enabled[e] != 0 && v.enabled >= last->enabled[e]) {
            __sync_fetch_and_add(&acc->counter[e], v.counter - last->counter[e]);
            __sync_fetch_and_add(&acc->enabled[e], v.enabled - last->enabled[e]);
            __sync_fetch_and_add(&acc->running[e], v.running - last->running[e]);
        }
        last->counter[e] = v.counter;
        last->enabled[e] = v.enabled;
        last->running[e] = v.running;
    }
    if (!acc) {
        u64 *d = pmu_dropped.lookup(&zero_idx);
        if (d)
            __sync_fetch_and_add(d, 1);
    }
    return 0;
}
