"""`python -m trainer` used to be `vpo train`; the trainer is a library that knows nothing of
the harness, so the command lives there: `python -m harness.cli.train ARGS` (and
`accelerate launch -m harness.cli.train ARGS`, `torchrun -m harness.cli.train ARGS`)."""

import sys

if __name__ == "__main__":
    print(
        "vpo: error: `python -m trainer` is now `python -m harness.cli.train` "
        "(accelerate launch -m harness.cli.train ..., torchrun -m harness.cli.train ...)",
        file=sys.stderr,
    )
    sys.exit(2)
