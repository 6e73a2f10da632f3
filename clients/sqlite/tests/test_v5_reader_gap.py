"""V5 for readers: a connection that only read inside an application
transaction that then aborted must not keep that transaction's pages.
(Found in review, 2026-11-24: the VFS marked the cache stale only after a
nested *commit*.)"""

import os

import txfs
from test_vfs import connect


def test_a_reader_in_an_aborted_application_transaction_drops_what_it_read(db):
    d = os.path.dirname(db)
    a, b = connect(db), connect(db)
    a.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v)")
    a.execute("INSERT INTO t VALUES (1, 'committed')")
    assert a.execute("SELECT v FROM t").fetchall() == [("committed",)]
    txfs.begin(mount=d)
    b.execute("UPDATE t SET v = 'aborted' WHERE k = 1")  # counter c -> c+1, nested in the application's transaction
    assert a.execute("SELECT v FROM t").fetchall() == [("aborted",)]  # a caches pages under c+1
    txfs.abort()  # the file is back at c
    b.execute("INSERT INTO t VALUES (2, 'x')")  # commits: c -> c+1 again (A-B-A)
    assert a.execute("SELECT v FROM t WHERE k = 1").fetchall() == [("committed",)]
    assert a.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [(1, "committed"), (2, "x")]
