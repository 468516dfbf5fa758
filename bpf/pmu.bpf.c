// PMU counters per container at a cost independent of the number of containers.
//
// Each event is opened once per CPU (pid=-1, cpu=c) into `pmu_events` at index
// event * PB_NCPU + cpu. At every sched_switch (current == the outgoing task) this CPU's counters
// are read with bpf_perf_event_read_value and the delta since the previous switch on this CPU is
// added to the outgoing task's cgroup, together with the enabled/running time deltas so that
// userspace can correct for multiplexing (scaled = counter * enabled / running). The same path
// runs with software events (task-clock, context-switches, cpu-migrations) where no PMU exists.
//
// Defines: PB_NEVENTS (1..8), PB_NCPU (possible CPUs), PB_MAX_KEYS, PB_KEY_PID (key by process).

#ifndef PB_NEVENTS
#define PB_NEVENTS 1
#endif
#ifndef PB_NCPU
#define PB_NCPU 1
#endif
#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif

struct pmu_reading {
    u64 counter[PB_NEVENTS];
    u64 enabled[PB_NEVENTS];
    u64 running[PB_NEVENTS];
};

BPF_PERF_ARRAY(pmu_events, PB_NEVENTS * PB_NCPU);
BPF_PERCPU_ARRAY(pmu_last, struct pmu_reading, 1);  // this CPU's reading at its previous switch
BPF_HASH(pmu_counts, u64, struct pmu_reading, PB_MAX_KEYS);
BPF_ARRAY(pmu_dropped, u64, 1);

TRACEPOINT_PROBE(sched, sched_switch) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
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
        if (pmu_events.perf_counter_value(e * PB_NCPU + cpu, &v, sizeof(v)) != 0)
            continue;
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
