"""``python -m graphexec.cli``: the same as the ``graphexec`` console script."""

import sys

from graphexec.cli import main

sys.exit(main())
