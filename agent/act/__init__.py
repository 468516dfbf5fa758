"""Acting room: actuators apply a Plan's actions (cpusets, RDT classes, VMM vCPU threads); they never plan."""
