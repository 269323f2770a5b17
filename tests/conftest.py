"""Every fixture comes from the harness plugin (tests/harness/plugin.py): real servers, stores
with a per-test key prefix, and the subprocess launcher; tests/harness/parallel.py keeps the
xdist workers apart."""

pytest_plugins = ["tests.harness.parallel", "tests.harness.plugin"]
