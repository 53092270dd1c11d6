"""`python -m statefleet` is `statefleet`."""

import sys

from statefleet.cli import main

sys.exit(main())
