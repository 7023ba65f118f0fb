"""Observation: read-only faces of a database, and what a run shows while it runs.

    views       what `vpo db` prints (programs, lineage, best@k, measures)
    exports     what `vpo db export` writes (JSONL, Parquet)
    plots       what `vpo db plot` draws (PNG)
    status      `vpo status`: one campaign's state at a glance
    time_split  the stages of a campaign's batches, added up; ledger: the stopwatch that times them
    progress    a run's progress line
    windows     the recent window and rolling means the views read measures through (the
                 measures themselves: trainer.measures)
    dashboard   what the dashboard shows, kept fresh incrementally per campaign
    genealogy   the campaign as a tree, for the genealogy page; gists: a program's facts in short
    web         its FastAPI app (`vpo ui`), the loopback guard; ui/: the page itself

Never the loop, the sandbox or a generator; beside the rooms, records and trainer.measures.
May import: store, config
"""
