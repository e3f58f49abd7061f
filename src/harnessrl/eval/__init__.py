"""Evaluation: probes and (later) benchmark runs and reports."""
