"""The predictive policy as a pipeline of small pure stages (README, "How the policy decides").

Each stage takes plain values and returns plain values plus the reasons it changed the outcome; the engine
(`policies.engine.decide`) only wires them together."""
