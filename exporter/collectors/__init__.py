"""Collectors, one source each. Every module here registers itself on import (see collector.py)."""
