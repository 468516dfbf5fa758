"""What bcc needs on a node the way a DaemonSet sees it, one module per job.

- `kernel`: the running release and the minimum versions our programs need;
- `headers`: kernel headers for bcc when the node's do not match (host, packaged, kheaders);
- `tracefs`: tracefs mounted, and the tracepoints of bpf.PROGRAMS present;
- `loader`: `prepare()` checks all of the above, `BpfEnv.load()` compiles with bcc and quotes
  clang's or the verifier's reason when that fails;
- `maps`: BPF hash maps of cumulative counters read into deltas, never destroyed;
- `keys`: which map keys belong to which container, and which still name something alive;
- `progstats`: run time and count of loaded programs.

`perfbalance doctor` reads these through collectors.doctor.
"""
