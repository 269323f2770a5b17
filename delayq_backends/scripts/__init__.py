"""The Lua scripts: one ``.lua`` file each, loaded and run by :mod:`.library`, called through
one typed object each (:mod:`.store` for the store's, :mod:`.rq` for the RQ target's).

Each script receives only the keys it touches; its helpers in ``includes/`` take those keys as
parameters.
"""

from __future__ import annotations

from .library import (
    LIBRARY,
    SCRIPT_NAMES,
    Backend,
    LuaScript,
    NodeFunctions,
    ScriptCall,
    ScriptRunner,
    function_name,
    functions_status,
    install_functions,
    library_code,
    parse_script,
    script,
    source,
)
from .rq import RqEnqueue, RqFields

__all__ = [
    "LIBRARY",
    "SCRIPT_NAMES",
    "Backend",
    "LuaScript",
    "NodeFunctions",
    "RqEnqueue",
    "RqFields",
    "ScriptCall",
    "ScriptRunner",
    "function_name",
    "functions_status",
    "install_functions",
    "library_code",
    "parse_script",
    "script",
    "source",
]
