"""Every fixture comes from the harness plugin (tests/harness/plugin.py): real servers, stores
with a per-test key prefix, and the subprocess launcher."""

pytest_plugins = ["tests.harness.plugin"]
