"""One strategy's replay on a lab of its own: the ledger of what is due, the work model, and the
I/O that drives the cluster and watches what it did."""
