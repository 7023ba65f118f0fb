"""Untrusted code, run and scored:

    sandbox       the worker pool a campaign evaluates in (limits, isolation, restarts)
    zygote        the fork server, standard library only, run as `python -I` (the one module
                  over 500 lines: it imports nothing of the harness)
    view          the root a candidate sees (only the interpreter, its libraries and its own
                  folder), standard library only: the fork server loads it by its path
    confinement   cgroups, seccomp and uids for the children
    results       decoding what a child returned
    evaluate      a problem's calls run in the sandbox and scored by trusted code

Beside records and problems/, never the store, the loop or a generator.
May import: config
"""
