"""`python -m nodecheck` runs the nodecheck command.

This folder is installed as the `nodecheck` namespace package itself (pyproject.toml's
package-dir): it holds only this module, no __init__.py, so `nodecheck.agent`,
`nodecheck.checks` and `nodecheck.tuning` stay portions of the same namespace.
"""

from nodecheck.agent.cli import main

main()
