"""`python -m eqsat`: the command line (eqsat/tools/main.py)."""

import sys

from eqsat.tools.main import main

if __name__ == "__main__":
    sys.exit(main(own_process=True))
