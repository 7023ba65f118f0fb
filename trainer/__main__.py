"""`python -m trainer ARGS` is `vpo train ARGS`, so that `accelerate launch -m trainer ...` and
`torchrun -m trainer ...` start the same training step on several devices."""

import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
