"""Periodic entries apart from any one task queue: schedules, state, firing, history."""
