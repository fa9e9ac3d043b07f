"""The `harness` command: a thin layer that parses options and calls the library. `common` holds
the click group and what its commands share; importing `runs` and `views` registers the commands."""
from .common import main
from . import runs, views  # noqa: F401  (each module's @main.command() adds its commands to main)

__all__ = ["main", "runs", "views"]
