"""The predictive policy as a pipeline of small pure stages (docs/stages.md).

The order is one tuple, `policies.engine.STAGES`. Each stage is the function `stage(spec, tick) -> tick`
of its own module, whose docstring starts "Stage N, name:" with N its place in that tuple; it reads the
frozen per-tick value `policies.types.Tick` and returns it with its findings and reasons added. The
functions behind a stage take plain values and return plain values plus the reasons they changed the
outcome, so each is tested alone (tests/test_stages.py). Modules without a number (`forecast`, `growth`)
are models the stages use."""
