"""One test file per Lua script, each on every real server kind (the ``store`` fixture)."""

from delayq_backends.targets import RedisListTarget

__all__ = ["ENV", "T"]

#: the envelope the script tests schedule: a list target, a one-byte body
ENV = RedisListTarget.envelope("out", b"x")
#: "now" in the script tests, in epoch ms (2096-10-02): later than any real clock they run on. It
#: was 2027-01-15, which the real clock passes: a script that takes the later of a time and the
#: server's now (debounce's counter expiry) then gives another answer.
T = 4_000_000_000_000
