"""Curated utility modules from which coding tasks are generated (see envs/code/tasks.py)."""
