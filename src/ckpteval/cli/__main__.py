"""`python -m ckpteval.cli` = the `evaluate` command."""

from ckpteval.cli.main import main

main()
