// Run-queue latency per container: how long a runnable task waits for a CPU.
//
// Two methods fill the same histograms (PB_SCHEDINFO selects):
//
// sched_info (PB_SCHEDINFO, a BTF raw tracepoint on sched_switch, the default where the kernel
// has BTF and CONFIG_SCHED_INFO): the kernel already measures every wait. It stamps a task when
// it is queued (woken, new, or preempted while runnable: sched_info.last_queued) and, when the
// task is switched in, adds the wait to task->sched_info.run_delay and counts the arrival in
// sched_info.pcount (kernel/sched/stats.h). Both happen after the sched_switch tracepoint, in
// context_switch(). So at the switch-in of `next` this CPU parks next's pcount and run_delay, and
// at its switch-out (the next sched_switch on this CPU, where prev is that task: a task switched
// in on a CPU runs there until it is switched out there) the run_delay grown by exactly one
// arrival is the wait before that run. No clock is read, no wakeup is traced, no slot is shared
// between CPUs, and no helper is called on the way: loads through the BTF-typed task pointers
// are plain instructions (on a CPU with retpolines and return thunks, each helper call here
// costs 40-80 ns). The key is prev's v2 cgroup id, read as bpf_get_current_cgroup_id() does
// (task->cgroups->dfl_cgrp->kn->id). Offsets come from the running kernel's BTF as defines
// (collectors/bpfenv/btf.py; the verifier checks each load against the same BTF): PB_OFF_PCOUNT,
// PB_OFF_RUN_DELAY, PB_OFF_CGROUPS, PB_OFF_DFL_CGRP, PB_OFF_KN, PB_OFF_KN_ID, PB_OFF_POPULATED
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
// Delays are gathered in per-CPU pending histograms, one per key for the last PB_WAYS keys that
// ran there, and added to the shared hash only when a key is evicted (the least recently used of
// them, for a new key) or PB_FLUSH delays have gathered: the hash lookup and its atomic adds,
// most of the cost, run once per flush instead of once per delay, and two or three containers
// taking turns on a CPU (the noisy-neighbour case) flush nothing. Userspace reads the pending histograms after the hash each cycle and counts their change
// (collectors/bpfenv/maps.py PendingSlots), so a delay is in the window it happened in even on a
// CPU that has not flushed: never lost, never misattributed.
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
// PB_SCHEDINFO and its offsets (above).

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
#define PB_WAYS 4
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

// This CPU's switch state.
struct rq_cpu {
#ifdef PB_SCHEDINFO
    u64 task;       // task_struct switched in on this CPU at its last sched_switch
    u64 pcount;     // its sched_info.pcount and run_delay then
    u64 run_delay;
    u64 cset;       // the css_set whose v2 cgroup id is cset_key (most switches stay in one)
    u64 cset_key;
#else
    u32 pid;    // thread switched in on this CPU at its last sched_switch
    u32 valid;
    u64 delay_ns;
#endif
    u64 tick;   // changes of the most recent way on this CPU (the ways' recency)
    u32 mru;    // the way accounted into last
    u32 pad;
};

// One key's delays gathered on this CPU, not yet in the hash.
struct rq_pend {
    u64 key;    // 0: free (cgroup ids and process ids are never 0)
    u64 n;      // delays in `pend`
    u64 used;   // rq_cpu.tick when it last became the CPU's most recent way
    struct rq_hist pend;
};

BPF_PERCPU_ARRAY(rq_park, struct rq_cpu, 1);
BPF_PERCPU_ARRAY(rq_pend, struct rq_pend, PB_WAYS);
BPF_HASH(rq_hist, u64, struct rq_hist, PB_MAX_KEYS);
BPF_ARRAY(rq_dropped, u64, 1);  // delays lost because the histogram map was full

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
static __always_inline struct rq_pend *rq_way(struct rq_cpu *p, u64 key) {
    u32 idx = p->mru;
    struct rq_pend *w = rq_pend.lookup(&idx);
    if (w && w->key == key)
        return w;
    struct rq_pend *victim = 0;
    u32 victim_idx = 0;
    u64 oldest = ~0ULL;
#pragma unroll
    for (u32 i = 0; i < PB_WAYS; i++) {
        u32 j = i;
        struct rq_pend *c = rq_pend.lookup(&j);
        if (!c)
            return 0;
        if (c->key == key) {
            p->mru = i;
            c->used = ++p->tick;
            return c;
        }
        if (c->used < oldest) {
            oldest = c->used;
            victim = c;
            victim_idx = i;
        }
    }
    if (!victim)
        return 0;
    rq_flush(victim);
    victim->key = key;
    victim->used = ++p->tick;
    p->mru = victim_idx;
    return victim;
}

// The pending delays of `key` on this CPU, if a way holds them, into the hash (at an exit).
static __always_inline void rq_flush_key(u64 key) {
    struct rq_pend *hit = 0;
#pragma unroll
    for (u32 i = 0; i < PB_WAYS; i++) {
        u32 j = i;
        struct rq_pend *c = rq_pend.lookup(&j);
        if (c && c->key == key)
            hit = c;
    }
    if (hit)  // one flush in the code, not one per way: the program stays small
        rq_flush(hit);
}

// One delay of `key` into this CPU's pending histograms.
static __always_inline void rq_account(struct rq_cpu *p, u64 delay_ns, u64 key) {
    struct rq_pend *w = rq_way(p, key);
    if (!w)
        return;
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
    int zero_idx = 0;
    struct rq_cpu *p = rq_park.lookup(&zero_idx);
    if (!p)
        return 0;
    void *prev = (void *)ctx[1];
    void *next = (void *)ctx[2];
    // The idle task never arrives (pcount stays 0), and a task parked before this program saw
    // its switch-in, or reused memory of an exited one, fails the one-arrival check.
    if (p->task == (u64)prev && PB_LOAD(u64, prev, PB_OFF_PCOUNT) == p->pcount + 1) {
        u64 delay = PB_LOAD(u64, prev, PB_OFF_RUN_DELAY) - p->run_delay;
#ifdef PB_KEY_PID
        rq_account(p, delay, PB_LOAD(u32, prev, PB_OFF_TGID));
#else
        void *cset = PB_LOAD(void *, prev, PB_OFF_CGROUPS);
        u64 key = p->cset_key;
        if ((u64)cset != p->cset) {  // a css_set names one v2 cgroup: its id only on a change
            key = rq_cgroup_id(PB_LOAD(void *, cset, PB_OFF_DFL_CGRP));
            asm volatile("" : "+r"(key));  // keeps clang from merging this load with cset_key's
            p->cset = (u64)cset;
            p->cset_key = key;
        }
        rq_account(p, delay, key);
#endif
    }
    if ((u32)ctx[3] & PB_TASK_DEAD) {
#ifdef PB_KEY_PID
        rq_flush_key(PB_LOAD(u32, prev, PB_OFF_TGID));
#else
        void *cgrp = rq_dfl_cgroup(prev);
        if (PB_LOAD(int, cgrp, PB_OFF_POPULATED) == 0)
            rq_flush_key(rq_cgroup_id(cgrp));
#endif
    }
    p->task = (u64)next;
    p->pcount = PB_LOAD(u64, next, PB_OFF_PCOUNT);
    p->run_delay = PB_LOAD(u64, next, PB_OFF_RUN_DELAY);
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
    int zero_idx = 0;
    struct rq_cpu *p = rq_park.lookup(&zero_idx);
    if (!p)
        return 0;
    u32 prev = args->prev_pid;
    // current == prev: the delay parked when prev was switched in is now attributable.
    if (p->valid && p->pid == prev)
        rq_account(p, p->delay_ns, rq_current_key());
    p->valid = 0;
    // An exiting task's delays go to the hash now: once its cgroup's last task is gone the
    // cgroup can be removed, and its entry pruned, before another key would flush them.
    if (args->prev_state & PB_TASK_REPORT_EXIT)
        rq_flush_key(rq_current_key());
    u64 now = rq_switched_in(p, args->next_pid);  // before prev's record can take next's slot
    if (prev && (args->prev_state & PB_TASK_REPORT_BITS) == 0)  // preempted: waiting again
        rq_runnable(prev, now ? now : bpf_ktime_get_ns());
    return 0;
}
#endif
