// AVX-512 use per container, from the FPU state saved at each context switch.
//
// x86_fpu_regs_deactivated fires when the outgoing task's registers are saved (switch_fpu_prepare,
// current == the outgoing task). Its `xfeatures` is the XSAVE header's XSTATE_BV: the components
// not in their init state. Bit 6 (ZMM_Hi256, upper halves of zmm0-15) is set only after real
// 512-bit execution, the thing that lowers core frequency; bits 5 (opmask) and 7 (Hi16_ZMM) alone
// come from EVEX-encoded 128/256-bit code such as glibc's string functions ("EVEX-256").
// Only tracepoint fields and helpers are used, so any kernel's headers compile this.
//
// Defines (see bpf/__init__.py): PB_MAX_KEYS (map size), PB_KEY_PID (key by process id instead of
// cgroup id, for hosts without cgroup v2 or bpf_get_current_cgroup_id).

#ifndef PB_MAX_KEYS
#define PB_MAX_KEYS 10240
#endif

#define XFEATURE_MASK_OPMASK (1ULL << 5)
#define XFEATURE_MASK_ZMM_HI256 (1ULL << 6)
#define XFEATURE_MASK_HI16_ZMM (1ULL << 7)

struct avx_counts {
    u64 zmm;      // switches with ZMM_Hi256 in use: real 512-bit execution
    u64 evex256;  // switches with opmask or Hi16_ZMM but not ZMM_Hi256
    u64 all;      // all FPU register saves of this key
};

BPF_HASH(avx_counts, u64, struct avx_counts, PB_MAX_KEYS);
BPF_ARRAY(avx_dropped, u64, 1);  // events lost because the map was full

TRACEPOINT_PROBE(x86_fpu, x86_fpu_regs_deactivated) {
#ifdef PB_KEY_PID
    u64 key = bpf_get_current_pid_tgid() >> 32;
#else
    u64 key = bpf_get_current_cgroup_id();
#endif
    struct avx_counts zero = {};
    struct avx_counts *c = avx_counts.lookup_or_try_init(&key, &zero);
    if (!c) {
        int idx = 0;
        u64 *d = avx_dropped.lookup(&idx);
        if (d)
            __sync_fetch_and_add(d, 1);
        return 0;
    }
    u64 xf = args->xfeatures;
    __sync_fetch_and_add(&c->all, 1);
    if (xf & XFEATURE_MASK_ZMM_HI256)
        __sync_fetch_and_add(&c->zmm, 1);
    else if (xf & (XFEATURE_MASK_OPMASK | XFEATURE_MASK_HI16_ZMM))
        __sync_fetch_and_add(&c->evex256, 1);
    return 0;
}
