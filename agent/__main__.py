"""`python -m nodecheck.agent` runs the nodecheck command."""

from nodecheck.agent.cli import main

main()
