"""The workload's side of a training job: the training subprocess and its result block (`runner`),
the training interpreter's versions (`trainenv`) and the private test split (`testsplit`)."""
