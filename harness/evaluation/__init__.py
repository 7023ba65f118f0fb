"""Untrusted code, run and scored:

    sandbox       the worker pool a campaign evaluates in (limits, isolation, restarts)
    zygote        the fork server, standard library only, run as `python -I` (the one module
                  over 500 lines: it must stand alone)
    confinement   cgroups, seccomp and uids for the children
    results       decoding what a child returned
    evaluate      a problem's calls run in the sandbox and scored by trusted code

May import config, records and problems/; never the store, the loop or a generator.
"""
