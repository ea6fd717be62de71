"""Layouts: process groups, meshes, wrapping and precision."""
