"""The wire: frames read ahead and written whole, acks batched per loop turn, and the one seam per
library (py-amqp, kombu).
"""
