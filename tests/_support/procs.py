"""Shared fixtures: procs."""
