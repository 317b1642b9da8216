"""The closed loop under live load: `python -m loadtest.e2e --scenario NAME [--factor K] [--json]`."""
