"""Helpers for testing onbeat and applications built on it."""

from onbeat.testing.clock import FakeClock

__all__ = ["FakeClock"]
