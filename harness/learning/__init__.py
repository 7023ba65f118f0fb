"""Learning: everything that turns stored groups into policy versions.

    steps        the bridge to trainer/: groups to steps, a campaign's trainer, the generator
                 that samples from its weights
    rewards      what a stored group scores (duplicates, the format, the token limit)
    publish      writing, loading and retiring policy versions
    offline      `vpo train --follow` and `vpo train --db`: training outside the loop
    answers      RL on answer problems (no database)
    trackers     a run's metrics to TensorBoard, MLflow, wandb and trackio (here, not in
                 observation, because it names its folders with publish's `safe_name`)

It knows nothing of the loop: evolution calls it. Beside the rooms it imports trainer/.
May import: observation, llm, store, config
"""
