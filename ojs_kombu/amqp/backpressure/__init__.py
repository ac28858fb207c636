"""Producer backpressure (``ojs-backpressure.md``): bounded-queue admission, queue-full nacks and a
circuit breaker per queue.
"""
