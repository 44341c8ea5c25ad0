"""``python -m lossscale``: see :mod:`lossscale.cli`."""
import sys

from lossscale.cli import main

if __name__ == "__main__":
    sys.exit(main())
