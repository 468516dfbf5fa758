"""BPF programs (bpf/*.bpf.c) and the pure function that renders them for bcc."""
