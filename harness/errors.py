"""Typed errors of the library; the CLI turns them into messages that say how to fix things."""


class HarnessError(Exception):
    """Base class: the message is written for the user and says what to do."""


class ConfigError(HarnessError):
    """A bad setting in the CLI flags or the research repo's config file."""


class RepoError(HarnessError):
    """The research repo is not in a state a run can start or resume from."""


class AgentError(HarnessError):
    """A researcher could not be created (unknown backend, missing executable or key)."""


class LedgerError(HarnessError):
    """The ledger cannot be written (disk full) or its record of rows cannot be trusted."""


class TrackError(HarnessError):
    """The experiment tracker cannot be used (not installed, unreachable, or the run is not one)."""


class ClusterError(HarnessError):
    """The training cluster (--executor ray) cannot be reached or cannot run a job."""


class ClusterGone(ClusterError):
    """The Ray cluster went away mid-run (its head stopped answering): the run stops with the
    candidates in flight kept (journals) for `--resume` once a cluster is back."""
