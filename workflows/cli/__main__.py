"""`python -m workflows.cli`: the `tracerl` console script."""

import sys

from workflows.cli.app import main

sys.exit(main())
