"""`python -m fox_numba` runs the `fox` command line."""

from fox_numba.cli import main

main()
