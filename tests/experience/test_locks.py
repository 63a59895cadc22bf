from __future__ import annotations

import threading
import time

from experience.locks import RWLock


def test_readers_share_and_a_waiting_writer_blocks_new_readers():
    lock = RWLock()
    events: list[str] = []
    first_reader_in = threading.Event()
    release_first = threading.Event()

    def first_reader():
        with lock.read():
            first_reader_in.set()
            release_first.wait(5)
            events.append("reader1 out")

    def writer():
        with lock.write():
            events.append("writer")

    def late_reader():
        with lock.read():
            events.append("reader2")

    t1 = threading.Thread(target=first_reader)
    t1.start()
    first_reader_in.wait(5)
    with lock.read():  # readers share the lock
        assert lock.readers == 2
    tw = threading.Thread(target=writer)
    tw.start()
    time.sleep(0.05)  # the writer is now waiting for reader1
    t2 = threading.Thread(target=late_reader)
    t2.start()
    time.sleep(0.05)
    assert events == []  # reader2 waits behind the writer (writer priority)
    release_first.set()
    for t in (t1, tw, t2):
        t.join(5)
    assert events == ["reader1 out", "writer", "reader2"]
