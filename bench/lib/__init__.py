"""The benches' shared library (imported as ``lib`` by the scripts in ``bench/``, which Python
puts on the path when it runs them); it imports no test module.

- ``report``: progress log, percentile/distribution, median with spread, targets and figures,
  load average, code digest, RESULTS.md.
- ``server``: ``BenchServer``, a Valkey the bench starts and may wipe.
- ``timing``: timed, interleaved repetitions metered on client and server.
- ``items``: the bodies, envelopes and bulk loads the benches schedule.
- ``processes``: subprocesses of this checkout, stopped at the end.
"""
