"""``python -m flight_gateway.cli``: the same as ``harness-gateway``."""

import sys

from flight_gateway.cli import main

sys.exit(main())
