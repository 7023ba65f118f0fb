"""Evolution: everything that turns the database into prompts, completions and stored programs.

    loop         run_campaign: batches of iterations, the end-of-run summary
    recording    an iteration's candidates classified and evaluated, the iteration stored
    run          one run's state; its population refreshed from the store
    generation   choosing an iteration (selection, prompt) and sampling its completions
    selection    islands, parents and drafts; population: the in-memory score matrix
    prompts      the prompt, sized in tokens; parsing: m candidates out of a completion;
                 edits: SEARCH/REPLACE edits written, read and applied
    iteration    one iteration's classification and record; novelty: what it is compared with
    budgets      token, call and cost budgets
    worker       `vpo worker`: claiming iterations of a campaign another process runs
    warmup       the format warm-up: the loop's prompts and parser, imitated (here, not in
                 learning, because it builds its examples with the loop's prepare and prompts)

It drives learning (a step after each batch, a version published) and reports through
observation; nothing imports it but the CLI.
May import: learning, observation, evaluation, llm, store, config
"""
