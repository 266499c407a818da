"""Helpers shared by unit and integration tests (not fixtures: plain functions)."""
