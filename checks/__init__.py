"""Reads a GPU node (sysfs, procfs, NVML) and judges it.

This layer imports nothing of nodecheck above it: `nodecheck.tuning` and
`nodecheck.agent` build on it. `node/` reads and parses the machine, the
check modules in `host/` judge what was read, `registry` and `runner` are the
framework that ties them together.
"""
