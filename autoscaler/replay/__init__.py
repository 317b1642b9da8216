"""Dry-run replay: the decisions a policy would have made for recorded signals."""
