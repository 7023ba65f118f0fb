"""Read-only faces of a database:

    views       what `vpo db` prints (programs, lineage, best@k, measures)
    exports     what `vpo db export` and `vpo db plot` write
    status      `vpo status`: one campaign's state at a glance
    measures    parse rate, hypervolume, rolling means (diversity and best@k: trainer.measures)
    dashboard   what the dashboard shows, kept fresh incrementally per campaign
    web         its FastAPI app (`vpo ui`), the loopback guard; ui/: the page itself

May import store, config, records and trainer.measures; never the loop, the sandbox or a
generator.
"""
