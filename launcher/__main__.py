"""`python -m launcher` = the `launcher` console script (same name in help and shell completion)."""

from launcher.console import main

main()
