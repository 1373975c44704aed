"""The `nodecheck` command: parsing the command line and dispatching, nothing else.

root.py holds the group and main() (the console script's entry point); options.py the
options the commands share; each command's own options and body are in its module
(check.py, tune.py, slurm_gate.py, ...), imported only when that command is run
(lazy.py), so `nodecheck check` builds check's options alone. Heavy modules (the check
framework, NVML, torch) are imported inside the commands, so `nodecheck --help` stays
fast.
"""

from nodecheck.agent.cli.root import cli, main

__all__ = ["cli", "main"]
