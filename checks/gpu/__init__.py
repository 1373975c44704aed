"""GPU checks that read NVML: one module per check, each judging every GPU."""
