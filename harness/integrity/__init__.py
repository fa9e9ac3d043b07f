"""What keeps a candidate honest before and after it trains: the git and file guard around the
researcher (`guard`), the static policy on its diff (`policy`) and the sealed channel of results
from the evaluation (`seal`); every parse and compile of a candidate's source goes through
`pysource`."""
