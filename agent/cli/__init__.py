"""The `nodecheck` command: parsing the command line and dispatching, nothing else.

root.py holds the group and main() (the console script's entry point); options.py the
options the commands share; each command's own options and body are in its module
(check.py, tune.py, slurm_gate.py, ...), imported only when that command is run
(lazy.py), so `nodecheck check` builds check's options alone. Heavy modules (the check
framework, NVML, torch) are imported inside the commands, so `nodecheck --help` stays
fast.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nodecheck.agent.cli.root import cli

__all__ = ["cli", "main"]


def main() -> None:
    """The console script: root.main, imported with the cyclic collector already off.

    root.main turns it off for the command's run; off before click, logging and the
    options load too, it never walks what they allocate (all of it lives as long as the
    process). A long-lived command turns it back on (options.long_lived)."""
    gc.disable()
    from nodecheck.agent.cli.root import main as run

    run()


def __getattr__(name: str) -> Any:
    # `cli`, the group, for those that drive it (tests): imported when asked for, so the
    # console script's main() comes first.
    if name == "cli":
        from nodecheck.agent.cli.root import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
