"""Host checks: each module reads one part of the node through sysfs or procfs and registers
one check named after it."""
