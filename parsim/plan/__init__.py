"""What-if capacity planning: the configuration space, the analytic pre-screen, confirmation by simulation and sweeps."""
