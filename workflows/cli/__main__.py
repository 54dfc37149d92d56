"""`python -m tracerl.workflows.cli`: the `tracerl` console script."""

import sys

from tracerl.workflows.cli.app import main

sys.exit(main())
