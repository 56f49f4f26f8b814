"""How a job is run, typed only: the Scenario and its tables (parallel degrees, MoE routing, training, schedule)."""
