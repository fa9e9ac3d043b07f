"""What keeps a candidate honest before and after it trains: the git and file guard around the
researcher and around each job (`guard`: the protected files before and after, the job's trusted
baseline), the static policy on its diff (`policy`), the time budget by the harness's clock
(`budget`) and the sealed channel of results from the evaluation (`seal`); every parse and
compile of a candidate's source goes through `pysource`."""
