"""Shared fixtures: hub."""
