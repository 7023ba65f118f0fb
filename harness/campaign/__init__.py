"""The campaign loop and its parts, top to bottom:

    loop         run_campaign: batches of iterations, the progress line, the end-of-run summary
    generation   choosing an iteration (selection, prompt) and sampling its completions
    selection    islands, parents and drafts; population: the in-memory score matrix
    prompts      the prompt, sized in tokens; parsing: m candidates out of a completion
    iteration    one iteration's classification and record
    run          one run's state; progress: its progress line; trackers: what it reports
    budgets      token, call and cost budgets; worker: `vpo worker`, claiming iterations
    training     the bridge to trainer/: groups to steps, policy versions; publish: writing them
    rewards      what a stored group scores (duplicates, the format, the token limit)
    offline      `vpo train --follow` and `vpo train --db`: training outside the loop
    warmup       the format warm-up; answers: RL on answer problems (no database)

May import store, evaluation, llm, inspect, config, records and trainer/; nothing imports it
but the CLI.
"""
