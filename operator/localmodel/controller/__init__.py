"""The operator (`localmodel run`): one level-based reconciler on kopf's watches.

Pure parts: `config` (flags), `observed` (what the watches hold -> placements,
usage, readiness), `changes` (desired vs existing -> create/apply/delete).
Imperative shell: `writer` (the only writes), `leader` (a Lease), `reconcile`
(one debounced task), `handlers` (kopf glue that only records and triggers),
`main` (wiring, health and metrics endpoints).
"""
