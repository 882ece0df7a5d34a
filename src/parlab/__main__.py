"""``python -m parlab check``: the same as the ``parlab`` command."""

import sys

from parlab.course.cli import main

sys.exit(main())
