"""`python -m framework` is `statefleet`."""

import sys

from framework.cli import main

sys.exit(main())
