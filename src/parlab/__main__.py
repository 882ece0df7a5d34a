"""``python -m parlab check``: the same as the ``parlab`` command."""

import sys

from parlab.cli import main

sys.exit(main())
