"""Fixtures for the chaos suite; the helpers live in chaos_support.py."""

from chaos_support import netns

__all__ = ["netns"]
