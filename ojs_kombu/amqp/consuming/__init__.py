"""Consuming jobs: the receiver, the delivery Celery settles, the decided outcome as broker
operations, and the outcome publisher.
"""
