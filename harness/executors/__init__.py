"""Where and how a training job runs: the sandbox around it (sandbox.py) and the evaluation
that takes its metric from outside the researcher's process (evaluation.py)."""
