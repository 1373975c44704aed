"""A fake NVIDIA driver library (libnvidia-ml.so.1) for tests; see README.md."""
