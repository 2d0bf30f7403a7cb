"""`python -m launcher` = the `launcher` console script."""

from launcher.cli import main

main()
