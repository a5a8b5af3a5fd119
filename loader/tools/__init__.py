"""Layer 10, tools: the ``babelfeed`` command and what it shows (cli, demo, preview, plan_report, plots, stats).
Imports anything below.
"""
