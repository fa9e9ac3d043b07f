"""autoresearch-harness: an unattended overnight autoresearch loop."""

__version__ = "0.1.0"
