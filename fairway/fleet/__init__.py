"""Many prefill nodes behind a router, on one virtual clock (issue 48).

The router decides where a request runs, each node's policy in which order the requests it got
start. `fairway.fleet.routing` is the contract between the two halves: what a router sees of a
request and of the nodes (only what its real counterpart sees, with the delays it sees it) and
what it answers.
"""
