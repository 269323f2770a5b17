"""The harness's parallel workers (tests/harness/parallel.py): each worker's own Redis database,
and the room an ``alone`` test has to itself, a waiting one passed by no newcomer."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from tests.harness.parallel import room, worker_url
from tests.helpers import wait_for


def test_each_worker_gets_the_named_database_moved_up_by_its_number() -> None:
    assert worker_url("redis://127.0.0.1:1/8", 0) == "redis://127.0.0.1:1/8"
    assert worker_url("redis://u:pw@127.0.0.1:1/8", 3) == "redis://u:pw@127.0.0.1:1/11"
    assert worker_url("redis://127.0.0.1:1", 2) == "redis://127.0.0.1:1/2"  # no database named: 0


def test_an_alone_test_waits_for_the_room_to_empty_and_no_newcomer_passes_it(tmp_path: Path) -> None:
    order: list[str] = []
    inside, leave = threading.Event(), threading.Event()

    def neighbour() -> None:
        with room(tmp_path, alone=False):
            order.append("neighbour in")
            inside.set()
            leave.wait(10)
            order.append("neighbour out")

    def enter(name: str, *, alone: bool) -> None:
        with room(tmp_path, alone=alone):
            order.append(name)

    first = threading.Thread(target=neighbour)
    first.start()
    assert inside.wait(10)
    waiting = threading.Thread(target=enter, args=("alone",), kwargs={"alone": True})
    waiting.start()
    wait_for(lambda: held(tmp_path / "gate"), 10, "the alone test to take the gate")
    assert waiting.is_alive(), "an alone test entered beside a running one"
    newcomer = threading.Thread(target=enter, args=("newcomer",), kwargs={"alone": False})
    newcomer.start()
    newcomer.join(0.3)
    assert newcomer.is_alive(), "a newcomer entered while an alone test waited"
    leave.set()
    for thread in (first, waiting, newcomer):
        thread.join(10)
    assert order == ["neighbour in", "neighbour out", "alone", "newcomer"]


def held(lock: Path) -> bool:
    """Whether another open file holds ``lock``."""
    with lock.open("a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False
