"""Shared fixtures: data."""
