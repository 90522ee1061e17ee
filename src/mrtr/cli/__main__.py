"""`python -m mrtr.cli ...`: the same as the `mrtr` script."""

from mrtr.cli import main

main()
