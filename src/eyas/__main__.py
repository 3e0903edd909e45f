"""`python -m eyas VERB ...` is `eyas VERB ...`; so `torchrun --nproc_per_node=N -m eyas train ...`
runs one training process per rank."""

import sys

from eyas.cli import main

if __name__ == "__main__":
    sys.exit(main())
