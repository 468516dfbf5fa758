// Run-queue latency per container: how long a runnable task waits for a CPU.
//
// A task becomes runnable at sched_wakeup / sched_wakeup_new (fired in the waker's context, so
// current is NOT the woken task: only its pid, a tracepoint field, is known there), or stays
// runnable when it is preempted (sched_switch with a prev_state whose TASK_REPORT bits, 0x7f plus
// TASK_REPORT_IDLE 0x80, are all clear: "R" or "R+" in the tracepoint's own print format). The
// time it became runnable is stored by thread id. At sched_switch the incoming task (next_pid)
// stops waiting: its delay is computed there, but current is still the outgoing task, so its
// cgroup is not known yet. The delay is parked in this CPU's slot and attributed at the NEXT
// sched_switch on the same CPU, where current is exactly that task (a task switched in on a CPU
// runs there until it is switched out there), so bpf_get_current_cgroup_id() names its cgroup.
// No kernel struct layout is read: tracepoint fields and helpers only.
//
// Per key, a log2 histogram of delays in microseconds (slot i: [2^i, 2^(i+1)) us, slot 0 also
// holds < 1 us, the last slot everything above) plus the count and the sum in ns, all cumulative.
//
// Defines (see bpf/__init__.py): PB_MAX_KEYS (histogram map size), PB_MAX_TASKS (runnable-since
// map, LRU so that tasks that die while runnable cannot fill it), PB_KEY_PID (key by process id
// instead of cgroup id, for hosts without cgroup v2 or bpf_get_current_cgroup_id).

#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif
#ifndef PB_MAX_TASKS
#define PB_MAX_TASKS 65536
#endif
#define PB_SLOTS 24
#define PB_TASK_REPORT_BITS 0xff

struct rq_hist {
    u64 slot[PB_SLOTS];
    u64 count;
    u64 sum_ns;
};

struct rq_parked {
    u32 pid;    // thread switched in on this CPU at its last sched_switch
    u32 valid;
    u64 delay_ns;
};

BPF_TABLE("lru_hash", u32, u64, rq_start, PB_MAX_TASKS);  // thread id -> runnable since (ns)
BPF_PERCPU_ARRAY(rq_park, struct rq_parked, 1);
BPF_HASH(rq_hist, u64, struct rq_hist, PB_MAX_KEYS);
BPF_ARRAY(rq_dropped, u64, 1);  // delays lost because the histogram map was full

static __always_inline void rq_runnable(u32 pid) {
    if (pid == 0)
        return;  // the idle task never waits
    u64 ts = bpf_ktime_get_ns();
    rq_start.update(&pid, &ts);
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    rq_runnable(args->pid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    rq_runnable(args->pid);
    return 0;
}

static __always_inline void rq_account(struct rq_parked *p) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    struct rq_hist zero = {};
    struct rq_hist *h = rq_hist.lookup_or_try_init(&key, &zero);
    if (!h) {
        int idx = 0;
        u64 *d = rq_dropped.lookup(&idx);
        if (d)
            __sync_fetch_and_add(d, 1);
        return;
    }
    u64 us = p->delay_ns / 1000;
    u32 s = us ? bpf_log2l(us) : 0;
    if (s >= PB_SLOTS)
        s = PB_SLOTS - 1;
    __sync_fetch_and_add(&h->slot[s], 1);
    __sync_fetch_and_add(&h->count, 1);
    __sync_fetch_and_add(&h->sum_ns, p->delay_ns);
}

TRACEPOINT_PROBE(sched, sched_switch) {
    int zero_idx = 0;
    struct rq_parked *p = rq_park.lookup(&zero_idx);
    if (!p)
        return 0;
    u32 prev = args->prev_pid;
    // current == prev: the delay parked when prev was switched in is now attributable.
    if (p->valid && p->pid == prev)
        rq_account(p);
    p->valid = 0;
    if ((args->prev_state & PB_TASK_REPORT_BITS) == 0)
        rq_runnable(prev);  // preempted: still runnable, waiting again from now
    u32 next = args->next_pid;
    u64 *since = rq_start.lookup(&next);
    if (!since)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (now > *since) {
        p->pid = next;
        p->delay_ns = now - *since;
        p->valid = 1;
    }
    rq_start.delete(&next);
    return 0;
}
