"""The code of the documentation's examples (docs/ includes them from here).

Each example sits between ``# [name]`` and ``# [/name]`` inside a function that gives
it what it needs (an app, a task); ``tests/test_doc_snippets.py`` and
``integration/test_doc_snippets.py`` call those functions, so every snippet a user
copies from the docs has run.
"""
