"""``python -m babelfeed.cli``: the ``babelfeed`` command (``babelfeed.tools.cli``)."""

import sys

from babelfeed.tools.cli import *  # noqa: F401,F403  (the command's module, under its former name)
from babelfeed.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
