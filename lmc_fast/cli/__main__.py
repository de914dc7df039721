"""`python -m lmc_fast.cli`: the same as the `lmc-fast` command."""
import sys

from . import main

sys.exit(main())
