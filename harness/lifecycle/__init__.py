"""A run's lifecycle on disk and in time: opening and resuming a run (`runs`; its manifest run.json
and trusted baseline: `manifest`), recovering what a killed supervisor left (`recovery`), the one
supervisor of child processes (`supervise`), health checkpoints (`health`), the stop policy
(`stops`), the fault points of the fault suite (`faults`) and a full disk, the machine's fault
(`disk`)."""
