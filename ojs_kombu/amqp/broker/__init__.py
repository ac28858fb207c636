"""The broker's objects: connections and their reconnection, the OJS topology and its declarations,
permissions, control queues and dead-letter tools.
"""
