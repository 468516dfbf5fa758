// AVX-512 use per container, from the FPU state saved at each context switch.
//
// x86_fpu_regs_deactivated fires when the outgoing task's registers are saved (switch_fpu_prepare,
// current == the outgoing task). Its `xfeatures` is the XSAVE header's XSTATE_BV: the components
// not in their init state. Bit 6 (ZMM_Hi256, upper halves of zmm0-15) is set only after real
// 512-bit execution, the thing that lowers core frequency; bits 5 (opmask) and 7 (Hi16_ZMM) alone
// come from EVEX-encoded 128/256-bit code such as glibc's string functions ("EVEX-256").
// Only tracepoint fields and helpers are used, so any kernel's headers compile this.
//
// Counting goes through a per-CPU pending entry: consecutive events of one key on a CPU add to it
// with plain increments (a per-CPU array lookup, inlined by the verifier), and the pending counts
// are added to the shared hash only when the key on that CPU changes or PB_FLUSH events have
// gathered. The hash lookup and its atomic adds, most of the program's cost, run once per flush
// instead of once per event. Userspace reads the pending entries after the hash each cycle and
// counts their change (collectors/bpfenv/maps.py PendingSlots), so a count is in the window it
// happened in even on a CPU that has not flushed: never lost, never misattributed.
//
// Defines (see bpf/__init__.py): PB_MAX_KEYS (map size), PB_KEY_PID (key by process id instead of
// cgroup id, for hosts without cgroup v2 or bpf_get_current_cgroup_id), PB_FLUSH (events gathered
// per CPU before they are added to the hash; 1 adds every event at once).

#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif
#ifndef PB_FLUSH
#define PB_FLUSH 32
#endif

#define XFEATURE_MASK_OPMASK (1ULL << 5)
#define XFEATURE_MASK_ZMM_HI256 (1ULL << 6)
#define XFEATURE_MASK_HI16_ZMM (1ULL << 7)

struct avx_counts {
    u64 zmm;      // switches with ZMM_Hi256 in use: real 512-bit execution
    u64 evex256;  // switches with opmask or Hi16_ZMM but not ZMM_Hi256
    u64 all;      // all FPU register saves of this key
};

struct avx_pending {
    u64 key;  // the key whose counts this CPU is gathering
    struct avx_counts n;
};

BPF_HASH(avx_counts, u64, struct avx_counts, PB_MAX_KEYS);
BPF_PERCPU_ARRAY(avx_pending, struct avx_pending, 1);
BPF_ARRAY(avx_dropped, u64, 1);  // events lost because the map was full

static __always_inline void avx_flush(struct avx_pending *p) {
    if (p->n.all == 0)
        return;
    u64 key = p->key;
    struct avx_counts zero = {};
    struct avx_counts *c = avx_counts.lookup_or_try_init(&key, &zero);
    if (c) {
        __sync_fetch_and_add(&c->all, p->n.all);
        if (p->n.zmm)
            __sync_fetch_and_add(&c->zmm, p->n.zmm);
        if (p->n.evex256)
            __sync_fetch_and_add(&c->evex256, p->n.evex256);
    } else {
        int idx = 0;
        u64 *d = avx_dropped.lookup(&idx);
        if (d)
            __sync_fetch_and_add(d, p->n.all);
    }
    p->n.all = 0;
    p->n.zmm = 0;
    p->n.evex256 = 0;
}

TRACEPOINT_PROBE(x86_fpu, x86_fpu_regs_deactivated) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    int idx = 0;
    struct avx_pending *p = avx_pending.lookup(&idx);
    if (!p)
        return 0;
    if (p->key != key) {
        avx_flush(p);
        p->key = key;
    }
    u64 xf = args->xfeatures;
    p->n.all++;
    if (xf & XFEATURE_MASK_ZMM_HI256)
        p->n.zmm++;
    else if (xf & (XFEATURE_MASK_OPMASK | XFEATURE_MASK_HI16_ZMM))
        p->n.evex256++;
    if (p->n.all >= PB_FLUSH)
        avx_flush(p);
    return 0;
}
