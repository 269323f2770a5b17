"""One test file per Lua script, each on every real server kind (the ``store`` fixture)."""

from delayq_backends.targets import RedisListTarget

__all__ = ["ENV", "T"]

#: the envelope the script tests schedule: a list target, a one-byte body
ENV = RedisListTarget.envelope("out", b"x")
#: "now" in the script tests, in epoch ms (2027-01-15): far from any real clock
T = 1_800_000_000_000
