"""The package version, in a leaf module so that any room can report it without importing
the package's public facade (``mtgrpo/__init__.py``)."""

__version__ = "0.1.0"
