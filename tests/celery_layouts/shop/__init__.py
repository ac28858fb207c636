"""A shop's app as a team migrates it (four modules): typed arguments, explicit task ids,
countdown/eta/expires, retries, time limits, rate limits, beat and a Redis backend.  It
meets exactly the differences ``tests/test_cli_migrate_layouts.py`` lists, and none of the
refusals (valid queue names, JSON, priorities 0..9, delays within days)."""
