"""``python -m llmmesh`` runs the command line."""

import sys

from llmmesh.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
