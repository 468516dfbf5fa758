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
// missing, or taken by another thread, means "read" (never a wrong skip from a collision). A
// task that changed cgroup since it last switched out is the one inexact case: its next run is
// attributed to its old cgroup (once per move; container processes move at their start only).
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

struct pmu_task {
    u64 key;  // the thread's key when it last switched out
    u32 pid;  // the thread that wrote the slot
    u32 pad;
};
BPF_ARRAY(pmu_task, struct pmu_task, PB_TASK_SLOTS);
BPF_PERCPU_ARRAY(pmu_switches, u64, 2);  // [0] switches that read the counters, [1] that skipped

// Record prev's key; true when next was last seen with the same key (no read needed).
static __always_inline int pmu_same_key(u32 prev, u32 next, u64 key) {
    u32 idx = prev & (PB_TASK_SLOTS - 1);
    struct pmu_task *t = pmu_task.lookup(&idx);
    if (t && (t->pid != prev || t->key != key)) {
        t->key = key;
        t->pid = prev;
    }
    idx = next & (PB_TASK_SLOTS - 1);
    t = pmu_task.lookup(&idx);
    return t && t->pid == next && t->key == key;
}

TRACEPOINT_PROBE(sched, sched_switch) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    int skip = pmu_same_key(args->prev_pid, args->next_pid, key);
    u64 *n = pmu_switches.lookup(&skip);
    if (n)
        *n += 1;
    if (skip)
        return 0;
    int zero_idx = 0;
    struct pmu_reading *last = pmu_last.lookup(&zero_idx);
    if (!last)
        return 0;
    struct pmu_reading zero = {};
    struct pmu_reading *acc = pmu_counts.lookup_or_try_init(&key, &zero);
    u32 cpu = bpf_get_smp_processor_id();
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
