"""`python -m toolkit.cli`: the `toolkit` command."""

from toolkit.cli import main

main()
