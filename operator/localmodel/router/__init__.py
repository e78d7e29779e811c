"""The router (`localmodel router`): one endpoint in front of many models'
gateways. The `model` field picks the LocalModel, a session stays on the
replica that holds its prompt in cache unless waiting there costs more than
re-reading the history elsewhere (docs/router.md)."""
