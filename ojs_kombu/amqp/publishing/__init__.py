"""Publishing jobs: the confirm ledger, where every confirm-mode publish is numbered, and the
publish modes (waiting, deferred, batch).
"""
