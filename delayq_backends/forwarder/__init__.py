"""The forwarder, as a package: :class:`Forwarder` reads the store's clock and composes a
:class:`~.heartbeat.Heartbeat`, a :class:`~.passes.Pass` (claim -> prepare -> publish -> settle,
with :mod:`.hooks` for lossless mode, flow control and periodic entries), the
:class:`~.overlap.Sweeper` and the :class:`~.loop.Loop`; :class:`ForwarderSettings` holds its
settings, each defined once."""

from .core import Forwarder
from .settings import MAX_BATCH, ForwarderSettings
from .stats import ForwarderStats

__all__ = ["MAX_BATCH", "Forwarder", "ForwarderSettings", "ForwarderStats"]
