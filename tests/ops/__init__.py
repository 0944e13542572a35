"""INT4 ops, the C helper and the kernel registry."""
