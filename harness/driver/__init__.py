"""The one decision loop and what it decides with. `loop`: the runs driven over one executor
(`run`, `single`, `run_all`); `step`: one candidate's parts, each a worker's (propose, check,
commit, train); `decide`: the keep rule; `rebase`: a candidate carried onto a new best;
`prompt`: the researcher's program; `pipeline`: when pipelining is safe. Only the loop decides,
moves the branch and writes rows. Nothing is imported here, so `decide` is light to import."""
