"""Engine facts: what each inference engine is, as data (no logic, no imports).

One module per engine: its name, pinned version and image, port, the HTTP
paths the operator, the gateway and doctor call, the flags the rules render
and the environment variables the operator manages. The API, the rules, the
renderer, the gateway and doctor all read these, so each is written exactly
once (tests/unit/test_engine_home.py greps the tree for copies).
"""
