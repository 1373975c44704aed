"""Micro-benchmarks: matmul TFLOPS, all_reduce bus bandwidth, host-device copy bandwidth.

This package is the parent side: the job-safety gate, the child process with
its deadline, the state directory and the verdicts. It never imports torch;
only `child/`, run as a separate process, does.
"""
