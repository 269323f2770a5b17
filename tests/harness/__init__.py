"""The test harness: one launcher for subprocesses, the real servers and stores on them, and
the pytest plugin (``tests.harness.plugin``) that turns them into fixtures."""

from tests.harness.launch import ROOT, Launcher, Proc, checkout_env
from tests.harness.servers import AMQP_URL, SYSTEM_REDIS, delete_prefix, make_store

__all__ = ["AMQP_URL", "ROOT", "SYSTEM_REDIS", "Launcher", "Proc", "checkout_env", "delete_prefix", "make_store"]
