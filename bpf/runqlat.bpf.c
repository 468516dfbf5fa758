// Run-queue latency per container: how long a runnable task waits for a CPU.
//
// Two methods fill the same histograms (PB_SCHEDINFO selects):
//
// sched_info (PB_SCHEDINFO, a BTF raw tracepoint on sched_switch, the default where the kernel
// has BTF, CONFIG_SCHED_INFO and CONFIG_FAIR_GROUP_SCHED): the kernel already times every wait.
// It stamps a task with its run queue's clock when the task is queued (woken, new, or preempted
// while runnable: task->sched_info.last_queued) and, when the task is switched in, adds
// rq->clock - last_queued to sched_info.run_delay and counts the arrival in sched_info.pcount
// (sched_info_arrive(), kernel/sched/stats.h). That happens in context_switch(), just after the
// sched_switch tracepoint, with no clock update between the two. So at the tracepoint this
// program computes the very same difference for `next` (rq->clock read through prev's
// se.cfs_rq->rq: prev runs on this CPU) and accounts it to next's cgroup: no clock is read (the
// scheduler's own reading is loaded), no wakeup is traced, nothing is parked, and no helper is
// called on the way (loads through the BTF-typed task pointers are plain instructions; on a CPU
// with retpolines and return thunks each helper call here costs 40-80 ns). A task switched in
// without having been queued (last_queued 0, as the idle task always is) has no wait, and the
// kernel counts no arrival. The key is next's v2 cgroup id, read as bpf_get_current_cgroup_id()
// does (task->cgroups->dfl_cgrp->kn->id), only when next's css_set differs from the last one here.
// Offsets come from the running kernel's BTF as defines (collectors/bpfenv/btf.py; the verifier
// checks each load against the same BTF): PB_OFF_LAST_QUEUED, PB_OFF_SE_CFS_RQ, PB_OFF_CFS_RQ_RQ,
// PB_OFF_RQ_CLOCK, PB_OFF_CGROUPS, PB_OFF_DFL_CGRP, PB_OFF_KN, PB_OFF_KN_ID, PB_OFF_POPULATED
// (cgroup.nr_populated_csets), PB_OFF_TGID.
//
// wakeup stamps (the fallback, tracepoint fields and helpers only, no struct layout read):
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
// Delays are gathered in per-CPU pending histograms (ways), one per key for the last PB_WAYS keys
// that ran there, in that CPU's element of rq_cpus, and added to the shared hash only when a key
// is evicted (the least recently used of them, for a new key) or PB_FLUSH delays have gathered:
// the hash lookup and its atomic adds, most of the cost, run once per flush instead of once per
// delay, and two or three containers taking turns on a CPU (the noisy-neighbour case) flush
// nothing. Userspace reads the pending histograms after the hash each cycle and counts their
// change (collectors/bpfenv/maps.py PendingSlots), so a delay is in the window it happened in even
// on a CPU that has not flushed: never lost, never misattributed.
//
// An exiting task's delays go to the hash at its last switch when its cgroup has no other task
// left (cgroup.nr_populated_csets is 0 by then: cgroup_exit() ran before the final schedule), so
// the cgroup can be removed and its entry pruned before another key would flush them; with the
// wakeup stamps (no struct read) at every exit. Pending delays of a cgroup removed while another
// CPU still holds them are flushed at that CPU's next key change, and the entry they recreate is
// pruned by the next sweep of live keys (collectors/bpfenv/keys.py LiveKeys).
//
// Defines (see bpf/__init__.py): PB_MAX_KEYS (histogram map size), PB_TASK_BITS (log2 of the
// runnable-since slots), PB_KEY_PID (key by process id instead of cgroup id, for hosts without
// cgroup v2 or bpf_get_current_cgroup_id), PB_FLUSH (delays gathered per CPU before they are
// added to the hash; 1 adds every delay at once), PB_WAYS (keys each CPU gathers for at once),
// PB_NCPU (possible CPUs: rq_cpus' size), PB_SCHEDINFO and its offsets (above).

#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif
#ifndef PB_FLUSH
#define PB_FLUSH 32
#endif
#ifndef PB_TASK_BITS
#define PB_TASK_BITS 16
#endif
#ifndef PB_WAYS
#define PB_WAYS 4  // a power of two
#endif
#ifndef PB_NCPU
#define PB_NCPU 1
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

// One key's delays gathered on a CPU, not yet in the hash.
struct rq_pend {
    u64 key;    // 0: free (cgroup ids and process ids are never 0)
    u64 n;      // delays in `pend`
    u64 used;   // rq_cpu.tick when it last became the CPU's most recent way
    struct rq_hist pend;
};

// One CPU's switch state (a 64-byte header) and its pending ways: element `cpu` of rq_cpus, found
// by bpf_get_smp_processor_id(). An array element's address is computed from the map's own
// address, where a per-CPU array's lookup first loads this CPU's pointer from the map: on a cold
// cache that load is a miss in front of every other access (measured: docs/benchmarks.md).
// The array is mmapable only for its page-aligned values, so each element starts a cache line.
struct rq_cpu {
#ifdef PB_SCHEDINFO
    u64 cset;   // css_set of the last delay accounted here: way[mru] gathers for its cgroup
    u64 hpad[5];
#else
    u32 pid;    // thread switched in on this CPU at its last sched_switch
    u32 valid;
    u64 delay_ns;
    u64 hpad[4];
#endif
    u64 tick;   // changes of the most recent way on this CPU (the ways' recency)
    u32 mru;    // the way accounted into last
    u32 pad;
    struct rq_pend way[PB_WAYS];
};

BPF_F_TABLE("array", u32, struct rq_cpu, rq_cpus, PB_NCPU, BPF_F_MMAPABLE);
BPF_HASH(rq_hist, u64, struct rq_hist, PB_MAX_KEYS);
BPF_ARRAY(rq_dropped, u64, 1);  // delays lost because the histogram map was full

static __always_inline struct rq_cpu *rq_this_cpu(void) {
    u32 cpu = bpf_get_smp_processor_id();
    return rq_cpus.lookup(&cpu);
}

// One way's pending delays into the shared histogram of its key.
static __always_inline void rq_flush(struct rq_pend *p) {
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

// The way gathering for `key` on this CPU: the last used one, else the one that has it, else the
// least recently used one, flushed and given to `key`. Recency is stamped when a way becomes the
// most recent, not at every delay (no store on the common path); the most recent is never evicted.
static __always_inline struct rq_pend *rq_way(struct rq_cpu *c, u64 key) {
    struct rq_pend *w = &c->way[c->mru & (PB_WAYS - 1)];
    if (w->key == key)
        return w;
    struct rq_pend *victim = &c->way[0];
    u32 victim_idx = 0;
    u64 oldest = ~0ULL;
#pragma unroll
    for (u32 i = 0; i < PB_WAYS; i++) {
        struct rq_pend *o = &c->way[i];
        if (o->key == key) {
            c->mru = i;
            o->used = ++c->tick;
            return o;
        }
        if (o->used < oldest) {
            oldest = o->used;
            victim = o;
            victim_idx = i;
        }
    }
    rq_flush(victim);
    victim->key = key;
    victim->used = ++c->tick;
    c->mru = victim_idx;
    return victim;
}

// The pending delays of `key` on this CPU, if a way holds them, into the hash (at an exit).
static __always_inline void rq_flush_key(struct rq_cpu *c, u64 key) {
    struct rq_pend *hit = 0;
#pragma unroll
    for (u32 i = 0; i < PB_WAYS; i++) {
        if (c->way[i].key == key)
            hit = &c->way[i];
    }
    if (hit)  // one flush in the code, not one per way: the program stays small
        rq_flush(hit);
}

// One delay into way `w`'s pending histogram.
static __always_inline void rq_add(struct rq_pend *w, u64 delay_ns) {
    u64 units = delay_ns >> 10;
    // A 64-bit index, clamped in the register that indexes: with a u32, clang zero-extends one
    // copy for the comparison and another for the index, and the 6.1 verifier, not linking the
    // two, refuses the load ("R2 unbounded memory access"; newer verifiers accept it). The empty
    // asm (libbpf's barrier_var()) keeps clang from re-deriving the index after the clamp.
    u64 s = units ? bpf_log2l(units) : 0;
    if (s >= PB_SLOTS)
        s = PB_SLOTS - 1;
    asm volatile("" : "+r"(s));
    w->pend.slot[s]++;
    w->pend.sum_ns += delay_ns;
    if (++w->n >= PB_FLUSH)
        rq_flush(w);
}

#ifdef PB_SCHEDINFO
#define PB_TASK_DEAD 0x80  // TASK_DEAD in the raw prev_state (include/linux/sched.h, since 4.14)
#define PB_LOAD(type, base, off) (*(type *)((void *)(base) + (off)))

static __always_inline void *rq_dfl_cgroup(void *task) {
    void *cset = PB_LOAD(void *, task, PB_OFF_CGROUPS);
    return PB_LOAD(void *, cset, PB_OFF_DFL_CGRP);
}

// A v2 cgroup's id, as bpf_get_current_cgroup_id() gives it (cgroup->kn->id).
static __always_inline u64 rq_cgroup_id(void *cgrp) {
    return PB_LOAD(u64, PB_LOAD(void *, cgrp, PB_OFF_KN), PB_OFF_KN_ID);
}

// tp_btf sched_switch (collectors/bpfenv/rawtp.py attaches it): ctx[0] preempt, ctx[1] prev
// (current), ctx[2] next, ctx[3] prev_state (raw task state, not the tracepoint's TASK_REPORT).
int pb_runqlat_switch(unsigned long long *ctx) {
    void *prev = (void *)ctx[1];
    void *next = (void *)ctx[2];
    // last_queued is 0 for the idle task (never queued) and for a task switched in without
    // having been queued since its last run: no wait, and the kernel counts no arrival either.
    u64 queued = PB_LOAD(u64, next, PB_OFF_LAST_QUEUED);
    if (queued) {
        struct rq_cpu *c = rq_this_cpu();
        if (!c)
            return 0;
        // This CPU's run queue through prev's scheduling entity: prev runs here, so its
        // se.cfs_rq->rq is this CPU's rq (both were just used to switch it out).
        void *rq = PB_LOAD(void *, PB_LOAD(void *, prev, PB_OFF_SE_CFS_RQ), PB_OFF_CFS_RQ_RQ);
        u64 delay = PB_LOAD(u64, rq, PB_OFF_RQ_CLOCK) - queued;
#ifdef PB_KEY_PID
        rq_add(rq_way(c, PB_LOAD(u32, next, PB_OFF_TGID)), delay);
#else
        // A css_set names one v2 cgroup, so while the css_sets switched in stay the same the
        // most recent way is that cgroup's: its id is read only on a change.
        void *cset = PB_LOAD(void *, next, PB_OFF_CGROUPS);
        struct rq_pend *w;
        if ((u64)cset == c->cset) {
            w = &c->way[c->mru & (PB_WAYS - 1)];
        } else {
            c->cset = (u64)cset;
            w = rq_way(c, rq_cgroup_id(PB_LOAD(void *, cset, PB_OFF_DFL_CGRP)));
        }
        rq_add(w, delay);
#endif
    }
    if ((u32)ctx[3] & PB_TASK_DEAD) {
        struct rq_cpu *c = rq_this_cpu();
        if (!c)
            return 0;
#ifdef PB_KEY_PID
        rq_flush_key(c, PB_LOAD(u32, prev, PB_OFF_TGID));
#else
        void *cgrp = rq_dfl_cgroup(prev);
        if (PB_LOAD(int, cgrp, PB_OFF_POPULATED) == 0)
            rq_flush_key(c, rq_cgroup_id(cgrp));
#endif
    }
    return 0;
}

#else  // wakeup stamps

BPF_ARRAY(rq_start, u64, PB_TASK_SLOTS);  // (runnable since >> 10) << 22 | thread id

static __always_inline u64 rq_current_key(void) {
#ifdef PB_KEY_PID
    return bpf_get_current_pid_tgid() >> 32;
#else
    return bpf_get_current_cgroup_id();
#endif
}

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
    struct rq_cpu *p = rq_this_cpu();
    if (!p)
        return 0;
    u32 prev = args->prev_pid;
    // current == prev: the delay parked when prev was switched in is now attributable.
    if (p->valid && p->pid == prev)
        rq_add(rq_way(p, rq_current_key()), p->delay_ns);
    p->valid = 0;
    // An exiting task's delays go to the hash now: once its cgroup's last task is gone the
    // cgroup can be removed, and its entry pruned, before another key would flush them.
    if (args->prev_state & PB_TASK_REPORT_EXIT)
        rq_flush_key(p, rq_current_key());
    u64 now = rq_switched_in(p, args->next_pid);  // before prev's record can take next's slot
    if (prev && (args->prev_state & PB_TASK_REPORT_BITS) == 0)  // preempted: waiting again
        rq_runnable(prev, now ? now : bpf_ktime_get_ns());
    return 0;
}
#endif
