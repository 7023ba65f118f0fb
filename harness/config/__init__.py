"""Settings and what every room shares:

    settings   every knob once, with its default, check and help (`CampaignConfig`, `build`)
    files      the TOML file: sections, unknown keys, a campaign's stored settings
    logs       the run's log file and one-line messages
    errors     UserError, CampaignFailed: what a user is told in one line

Imports nothing else from the harness but records.
"""
