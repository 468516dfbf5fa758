"""Who runs where: containers in cgroupfs, the kubelet's CPUs, sysfs topology, pod metadata, VMM threads."""
