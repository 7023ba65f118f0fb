"""`python -m harness.cli ARGS` is `vpo ARGS`."""

import sys

from harness.cli import main

sys.exit(main())
