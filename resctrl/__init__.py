"""resctrl: Intel RDT classes and monitoring groups, configured the way the kernel expects."""
