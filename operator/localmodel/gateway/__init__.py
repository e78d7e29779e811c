"""The slot gate: a gateway in front of the engine in every model pod.

Always streams upstream so that cancellation is real, lets background callers
skip instead of queueing ahead of people, and exports queue, slot, prefill and
decode metrics. See docs/gateway.md.
"""
