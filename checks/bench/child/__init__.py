"""The benchmark child process: `python -m nodecheck.checks.bench.child SPEC`.

Only this package imports torch, and only in the child. It speaks JSON lines on
stdout: {"progress": 0.5} while running, then {"result": {...}} or
{"error": "...", "cause": "..."}. See child/__main__.py.
"""
