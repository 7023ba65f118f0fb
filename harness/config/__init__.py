"""Settings and what every room shares:

    settings   every campaign knob once, with its default, check and help (`CampaignSettings`,
               `build`)
    training   how a policy learns wherever it is trained (`TrainSettings`, a campaign's
               `training`), what a step needs of the model and its rollouts (`Sampling`), and
               the offline and answer-problem commands' settings
    values     how a setting is declared (`setting`: its flag and help), the float ranges,
               the one-line checks of a value, TOML writing of one
    files      the TOML file: sections, unknown keys, a campaign's stored settings
    logs       the run's log file and one-line messages
    errors     UserError, CampaignFailed: what a user is told in one line
    allocator  glibc's malloc thresholds for a `vpo` process: freed memory goes back

Imports nothing else from the harness but its records.
May import: nothing
"""
