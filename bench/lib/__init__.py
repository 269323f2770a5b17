"""The benches' shared library; it imports no test module. The scripts in ``bench/`` import it
as ``lib`` (Python puts ``bench/`` on the path when it runs them); the tests that share the
chaos run and the proxy import it as ``bench.lib``, which is why its own imports are relative.

- ``report``: progress log, percentile/distribution, median with spread, targets and figures,
  load average, code digest, RESULTS.md.
- ``server``: ``BenchServer``, a Valkey the bench starts and may wipe.
- ``timing``: timed, interleaved repetitions metered on client and server.
- ``items``: the bodies, envelopes and bulk loads the benches schedule.
- ``processes``: subprocesses of this checkout, stopped at the end.
- ``celery_run`` (+ ``celery_app``, the worker's app module): a broker, queue, sink, worker and
  forwarder for the Celery benches.
- ``proxy``: a loopback TCP proxy to cut and slow; ``chaos``: the chaos run of the Celery path.
"""
