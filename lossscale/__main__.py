"""``python -m lossscale``: see :mod:`lossscale.demo.cli`."""

import sys

from lossscale.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
