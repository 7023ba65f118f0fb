"""The campaign side of vpo-evolve, in rooms by job. Imports run one way, downward:

    cli          the `vpo` command: parser, commands, rendering
    campaign     the loop (select -> prompt -> generate -> parse -> evaluate -> store -> train)
                 and its parts; may import everything below
    inspect      read-only faces of a database (views, status, measures, dashboard, trackers);
                 may import store, config, records and trainer.measures, never the loop
    evaluation   untrusted code: the sandbox, its fork server, confinement, scoring
    llm          generators: vllm, transformers, an OpenAI-compatible server
    store        the database: models, migrations, the one `Store` facade
    config       settings, the TOML file, logs, errors
    records      plain frozen records passed between all of them; faults: named kill points

trainer/ (VPO and its baselines) and problems/ import nothing from here.
"""
