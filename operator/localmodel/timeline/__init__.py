"""`localmodel timeline`: where a model's time went, from its gateways' ledgers.

`report` (pure) turns ledger entries (GET /ledger, their format in
localmodel.gateway_contract) and the models sharing the node into the causes
in the field's debugging order; `cli` reads them from the cluster or one
gateway and prints them.
"""
