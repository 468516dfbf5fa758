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
// Runnable-since times live in a direct-mapped array indexed by the low bits of the thread id
// (an array lookup is a few instructions where a hash update costs a bucket lock and a free
// list): one u64 per slot packs the time in units of 1024 ns (high 42 bits, wrapping every 52
// days; differences stay exact) and the 22-bit thread id (PID_MAX_LIMIT is 2^22), so a
// concurrent wakeup on another CPU can never be read half-written. Two threads waiting at the
// same time whose ids share the low bits overwrite each other: the earlier one's wait is lost
// (checked by the id), never misattributed. A slot is cleared when its thread is switched in.
// The clock is read at most once per event (on VMs a clock read is most of the cost).
//
// Per key, a log2 histogram of delays in nanoseconds (slot i: [2^(i+10), 2^(i+11)) ns, i.e.
// from 1.024 us doubling; slot 0 also holds shorter waits, the last slot everything longer)
// plus the sum in ns, all cumulative; the count is the sum of the slots.
//
// Delays are gathered in a per-CPU pending histogram of the key that is running there, and added
// to the shared hash only when the key on that CPU changes or PB_FLUSH delays have gathered: the
// hash lookup and its atomic adds, most of the cost, run once per flush instead of once per
// delay. Userspace reads the pending histograms after the hash each cycle and counts their change
// (collectors/bpfenv/maps.py PendingSlots), so a delay is in the window it happened in even on a
// CPU that has not flushed: never lost, never misattributed.
//
// Defines (see bpf/__init__.py): PB_MAX_KEYS (histogram map size), PB_TASK_BITS (log2 of the
// runnable-since slots), PB_KEY_PID (key by process id instead of cgroup id, for hosts without
// cgroup v2 or bpf_get_current_cgroup_id), PB_FLUSH (delays gathered per CPU before they are
// added to the hash; 1 adds every delay at once).

#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif
#ifndef PB_FLUSH
#define PB_FLUSH 32
#endif
#ifndef PB_TASK_BITS
#define PB_TASK_BITS 16
#endif
#define PB_TASK_SLOTS (1 << PB_TASK_BITS)
#define PB_PID_BITS 22
#define PB_PID_MASK ((1ULL << PB_PID_BITS) - 1)
#define PB_SLOTS 24
#define PB_TASK_REPORT_BITS 0xff
#define PB_TASK_REPORT_EXIT 0x30  // EXIT_DEAD ("X") | EXIT_ZOMBIE ("Z") in prev_state

struct rq_hist {
    u64 slot[PB_SLOTS];
    u64 sum_ns;
};

struct rq_cpu {
    u32 pid;    // thread switched in on this CPU at its last sched_switch
    u32 valid;
    u64 delay_ns;
    u64 key;    // whose delays `pend` gathers
    u64 n;      // delays in `pend`
    struct rq_hist pend;
};

BPF_ARRAY(rq_start, u64, PB_TASK_SLOTS);  // (runnable since >> 10) << 22 | thread id
BPF_PERCPU_ARRAY(rq_park, struct rq_cpu, 1);
BPF_HASH(rq_hist, u64, struct rq_hist, PB_MAX_KEYS);
BPF_ARRAY(rq_dropped, u64, 1);  // delays lost because the histogram map was full

static __always_inline void rq_runnable(u32 pid, u64 now) {
    u32 idx = pid & (PB_TASK_SLOTS - 1);
    u64 *slot = rq_start.lookup(&idx);
    if (slot)
        *slot = ((now >> 10) << PB_PID_BITS) | (pid & PB_PID_MASK);
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    if (args->pid)
        rq_runnable(args->pid, bpf_ktime_get_ns());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    if (args->pid)
        rq_runnable(args->pid, bpf_ktime_get_ns());
    return 0;
}

// This CPU's pending delays into the shared histogram of their key.
static __always_inline void rq_flush(struct rq_cpu *p) {
    if (p->n == 0)
        return;
    u64 key = p->key;
    struct rq_hist zero = {};
    struct rq_hist *h = rq_hist.lookup_or_try_init(&key, &zero);
    if (h) {
#pragma unroll
        for (int i = 0; i < PB_SLOTS; i++) {
            if (p->pend.slot[i]) {
                __sync_fetch_and_add(&h->slot[i], p->pend.slot[i]);
                p->pend.slot[i] = 0;
            }
        }
        __sync_fetch_and_add(&h->sum_ns, p->pend.sum_ns);
    } else {
        int idx = 0;
        u64 *d = rq_dropped.lookup(&idx);
        if (d)
            __sync_fetch_and_add(d, p->n);
#pragma unroll
        for (int i = 0; i < PB_SLOTS; i++)
            p->pend.slot[i] = 0;
    }
    p->pend.sum_ns = 0;
    p->n = 0;
}

static __always_inline void rq_account(struct rq_cpu *p) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    if (p->key != key) {
        rq_flush(p);
        p->key = key;
    }
    u64 units = p->delay_ns >> 10;
    // A 64-bit index, clamped in the register that indexes: with a u32, clang zero-extends one
    // copy for the comparison and another for the index, and the 6.1 verifier, not linking the
    // two, refuses the load ("R2 unbounded memory access"; newer verifiers accept it). The empty
    // asm (libbpf's barrier_var()) keeps clang from re-deriving the index after the clamp.
    u64 s = units ? bpf_log2l(units) : 0;
    if (s >= PB_SLOTS)
        s = PB_SLOTS - 1;
    asm volatile("" : "+r"(s));
    p->pend.slot[s]++;
    p->pend.sum_ns += p->delay_ns;
    if (++p->n >= PB_FLUSH)
        rq_flush(p);
}

// The waiting time of `next`, parked for attribution; returns the clock it read (0: none).
static __always_inline u64 rq_switched_in(struct rq_cpu *p, u32 next) {
    u32 idx = next & (PB_TASK_SLOTS - 1);
    u64 *slot = rq_start.lookup(&idx);
    if (!slot)
        return 0;
    u64 v = *slot;
    if (v == 0 || (v & PB_PID_MASK) != (next & PB_PID_MASK))
        return 0;  // not recorded, or overwritten by another thread with the same low id bits
    *slot = 0;
    u64 now = bpf_ktime_get_ns();
    u64 units = ((now >> 10) - (v >> PB_PID_BITS)) & ((1ULL << (64 - PB_PID_BITS)) - 1);
    p->pid = next;
    p->delay_ns = units << 10;
    p->valid = 1;
    return now;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    int zero_idx = 0;
    struct rq_cpu *p = rq_park.lookup(&zero_idx);
    if (!p)
        return 0;
    u32 prev = args->prev_pid;
    // current == prev: the delay parked when prev was switched in is now attributable.
    if (p->valid && p->pid == prev)
        rq_account(p);
    p->valid = 0;
    // An exiting task's delays go to the hash now: once its cgroup's last task is gone the
    // cgroup can be removed, and its entry pruned, before another key would flush them.
    if (args->prev_state & PB_TASK_REPORT_EXIT)
        rq_flush(p);
    u64 now = rq_switched_in(p, args->next_pid);  // before prev's record can take next's slot
    if (prev && (args->prev_state & PB_TASK_REPORT_BITS) == 0)  // preempted: waiting again
        rq_runnable(prev, now ? now : bpf_ktime_get_ns());
    return 0;
}
