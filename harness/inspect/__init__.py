"""Read-only faces of a database:

    views       what `vpo db` prints (programs, lineage, best@k, measures)
    status      `vpo status`: one campaign's state at a glance
    measures    parse rate, hypervolume, rolling means (diversity and best@k: trainer.measures)
    dashboard   the web page (`vpo dashboard`) and its JSON; ui/: the page itself
    trackers    TensorBoard, MLflow, wandb and trackio reporting

May import store, config, records and trainer.measures; never the loop, the sandbox or a
generator.
"""
