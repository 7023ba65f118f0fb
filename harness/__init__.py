"""The campaign side of vpo-evolve, in rooms by job. Each room's `__init__` says what it owns
and, on its `May import:` line, which rooms it may import (tests/test_layers.py checks the code
against those lines; docs/layout.md names every module). Imports run one way, downward:

    cli          the `vpo` command: parser, commands, rendering
    evolution    the loop: select -> prompt -> generate -> parse -> evaluate -> store an iteration
    learning     stored groups into policy versions: rewards, steps, publishing, offline
                 training, answer problems, the experiment trackers
    observation  read-only faces of a database (views, status, measures, dashboard), a run's
                 progress line and the stopwatch of its batches
    evaluation   untrusted code: the sandbox, its fork server, confinement, scoring
    llm          generators: vllm, transformers, an OpenAI-compatible server
    store        the database: models, migrations, the one `Store` facade
    config       settings, the TOML file, logs, errors
    records      plain frozen records passed between all of them; faults: named kill points

trainer/ (VPO and its baselines) and problems/ import nothing from here.
"""
