"""A small TPC-C on SQLite (W11): one warehouse, scaled down, the five
transactions in the standard mix (45% New-Order, 43% Payment, 4% each
Order-Status, Delivery, Stock-Level). Not an audited TPC-C: no think times,
no terminals, customers looked up by id only; the schema and the reads and
writes of each transaction follow the specification's shape.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time

DISTRICTS = 10

SCHEMA = """
CREATE TABLE warehouse(w_id INTEGER PRIMARY KEY, w_name TEXT, w_tax REAL, w_ytd REAL);
CREATE TABLE district(d_id INTEGER PRIMARY KEY, d_name TEXT, d_tax REAL, d_ytd REAL, d_next_o_id INTEGER);
CREATE TABLE customer(c_d_id INTEGER, c_id INTEGER, c_last TEXT, c_credit TEXT, c_discount REAL,
  c_balance REAL, c_ytd_payment REAL, c_payment_cnt INTEGER, c_delivery_cnt INTEGER, c_data TEXT,
  PRIMARY KEY(c_d_id, c_id));
CREATE TABLE history(h_c_id INTEGER, h_d_id INTEGER, h_date REAL, h_amount REAL, h_data TEXT);
CREATE TABLE orders(o_d_id INTEGER, o_id INTEGER, o_c_id INTEGER, o_entry_d REAL, o_carrier_id INTEGER,
  o_ol_cnt INTEGER, PRIMARY KEY(o_d_id, o_id));
CREATE INDEX orders_cust ON orders(o_d_id, o_c_id, o_id);
CREATE TABLE new_order(no_d_id INTEGER, no_o_id INTEGER, PRIMARY KEY(no_d_id, no_o_id));
CREATE TABLE order_line(ol_d_id INTEGER, ol_o_id INTEGER, ol_number INTEGER, ol_i_id INTEGER,
  ol_delivery_d REAL, ol_quantity INTEGER, ol_amount REAL, ol_dist_info TEXT,
  PRIMARY KEY(ol_d_id, ol_o_id, ol_number));
CREATE TABLE item(i_id INTEGER PRIMARY KEY, i_name TEXT, i_price REAL, i_data TEXT);
CREATE TABLE stock(s_i_id INTEGER PRIMARY KEY, s_quantity INTEGER, s_ytd INTEGER, s_order_cnt INTEGER,
  s_remote_cnt INTEGER, s_dist TEXT, s_data TEXT);
"""


def astr(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(lo, hi)))


def populate(db: str, customers: int, items: int) -> None:
    rng = random.Random(7)
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=DELETE")
    c.executescript(SCHEMA)
    c.execute("INSERT INTO warehouse VALUES(1,'w1',0.1,300000)")
    c.executemany(
        "INSERT INTO item VALUES(?,?,?,?)",
        ((i, astr(rng, 14, 24), rng.uniform(1, 100), astr(rng, 26, 50)) for i in range(1, items + 1)),
    )
    c.executemany(
        "INSERT INTO stock VALUES(?,?,0,0,0,?,?)",
        ((i, rng.randint(10, 100), astr(rng, 24, 24), astr(rng, 26, 50)) for i in range(1, items + 1)),
    )
    initial_orders = customers
    for d in range(1, DISTRICTS + 1):
        c.execute("INSERT INTO district VALUES(?,?,?,30000,?)", (d, f"d{d}", rng.uniform(0, 0.2), initial_orders + 1))
        c.executemany(
            "INSERT INTO customer VALUES(?,?,?,?,?,-10,10,1,0,?)",
            (
                (d, i, astr(rng, 8, 16), "GC" if rng.random() > 0.1 else "BC", rng.uniform(0, 0.5), astr(rng, 300, 500))
                for i in range(1, customers + 1)
            ),
        )
        perm = list(range(1, customers + 1))
        rng.shuffle(perm)
        for o in range(1, initial_orders + 1):
            cnt = rng.randint(5, 15)
            delivered = o <= initial_orders * 0.7
            c.execute(
                "INSERT INTO orders VALUES(?,?,?,?,?,?)",
                (d, o, perm[o - 1], time.time(), rng.randint(1, 10) if delivered else None, cnt),
            )
            c.executemany(
                "INSERT INTO order_line VALUES(?,?,?,?,?,5,?,?)",
                (
                    (d, o, n, rng.randint(1, items), time.time() if delivered else None,
                     0 if delivered else rng.uniform(0.01, 9999.99), astr(rng, 24, 24))
                    for n in range(1, cnt + 1)
                ),
            )
            if not delivered:
                c.execute("INSERT INTO new_order VALUES(?,?)", (d, o))
    c.commit()
    c.close()


def run(mode: str, db: str, n: int, connect, Tx, fail, timed_start, timed_end) -> None:
    conn = connect(db, mode)
    (customers,) = conn.execute("SELECT max(c_id) FROM customer").fetchone()
    (items,) = conn.execute("SELECT max(i_id) FROM item").fetchone()
    (orders0,) = conn.execute("SELECT count(*) FROM orders").fetchone()
    rng = random.Random(11)
    counts = {"new_order": 0, "payment": 0, "order_status": 0, "delivery": 0, "stock_level": 0}
    x = conn.execute

    def new_order() -> None:
        d, cid = rng.randint(1, DISTRICTS), rng.randint(1, customers)
        lines = [(rng.randint(1, items), rng.randint(1, 10)) for _ in range(rng.randint(5, 15))]
        with Tx(mode, conn):
            (w_tax,) = x("SELECT w_tax FROM warehouse WHERE w_id=1").fetchone()
            d_tax, o_id = x("SELECT d_tax, d_next_o_id FROM district WHERE d_id=?", (d,)).fetchone()
            x("UPDATE district SET d_next_o_id=? WHERE d_id=?", (o_id + 1, d))
            (disc,) = x("SELECT c_discount FROM customer WHERE c_d_id=? AND c_id=?", (d, cid)).fetchone()
            x("INSERT INTO orders VALUES(?,?,?,?,NULL,?)", (d, o_id, cid, time.time(), len(lines)))
            x("INSERT INTO new_order VALUES(?,?)", (d, o_id))
            for num, (iid, qty) in enumerate(lines, 1):
                (price,) = x("SELECT i_price FROM item WHERE i_id=?", (iid,)).fetchone()
                s_qty, dist = x("SELECT s_quantity, s_dist FROM stock WHERE s_i_id=?", (iid,)).fetchone()
                s_qty = s_qty - qty if s_qty - qty >= 10 else s_qty - qty + 91
                x("UPDATE stock SET s_quantity=?, s_ytd=s_ytd+?, s_order_cnt=s_order_cnt+1 WHERE s_i_id=?", (s_qty, qty, iid))
                amount = qty * price * (1 + w_tax + d_tax) * (1 - disc)
                x("INSERT INTO order_line VALUES(?,?,?,?,NULL,?,?,?)", (d, o_id, num, iid, qty, amount, dist))

    def payment() -> None:
        d, cid, amt = rng.randint(1, DISTRICTS), rng.randint(1, customers), rng.uniform(1, 5000)
        with Tx(mode, conn):
            x("UPDATE warehouse SET w_ytd=w_ytd+? WHERE w_id=1", (amt,))
            x("UPDATE district SET d_ytd=d_ytd+? WHERE d_id=?", (amt, d))
            (credit,) = x("SELECT c_credit FROM customer WHERE c_d_id=? AND c_id=?", (d, cid)).fetchone()
            x(
                "UPDATE customer SET c_balance=c_balance-?, c_ytd_payment=c_ytd_payment+?, "
                "c_payment_cnt=c_payment_cnt+1 WHERE c_d_id=? AND c_id=?",
                (amt, amt, d, cid),
            )
            if credit == "BC":
                x("UPDATE customer SET c_data=substr(? || c_data, 1, 500) WHERE c_d_id=? AND c_id=?", (f"{cid} {d} {amt:.2f} ", d, cid))
            x("INSERT INTO history VALUES(?,?,?,?,?)", (cid, d, time.time(), amt, "w1 d"))

    def order_status() -> None:
        d, cid = rng.randint(1, DISTRICTS), rng.randint(1, customers)
        with Tx(mode, conn, immediate=False):
            x("SELECT c_balance, c_last FROM customer WHERE c_d_id=? AND c_id=?", (d, cid)).fetchone()
            row = x("SELECT max(o_id) FROM orders WHERE o_d_id=? AND o_c_id=?", (d, cid)).fetchone()
            if row[0] is not None:
                x("SELECT * FROM order_line WHERE ol_d_id=? AND ol_o_id=?", (d, row[0])).fetchall()

    def delivery() -> None:
        carrier = rng.randint(1, 10)
        with Tx(mode, conn):
            for d in range(1, DISTRICTS + 1):
                row = x("SELECT min(no_o_id) FROM new_order WHERE no_d_id=?", (d,)).fetchone()
                if row[0] is None:
                    continue
                o = row[0]
                x("DELETE FROM new_order WHERE no_d_id=? AND no_o_id=?", (d, o))
                (cid,) = x("SELECT o_c_id FROM orders WHERE o_d_id=? AND o_id=?", (d, o)).fetchone()
                x("UPDATE orders SET o_carrier_id=? WHERE o_d_id=? AND o_id=?", (carrier, d, o))
                x("UPDATE order_line SET ol_delivery_d=? WHERE ol_d_id=? AND ol_o_id=?", (time.time(), d, o))
                (total,) = x("SELECT sum(ol_amount) FROM order_line WHERE ol_d_id=? AND ol_o_id=?", (d, o)).fetchone()
                x(
                    "UPDATE customer SET c_balance=c_balance+?, c_delivery_cnt=c_delivery_cnt+1 WHERE c_d_id=? AND c_id=?",
                    (total or 0, d, cid),
                )

    def stock_level() -> None:
        d, threshold = rng.randint(1, DISTRICTS), rng.randint(10, 20)
        with Tx(mode, conn, immediate=False):
            (nxt,) = x("SELECT d_next_o_id FROM district WHERE d_id=?", (d,)).fetchone()
            x(
                "SELECT count(DISTINCT s_i_id) FROM order_line JOIN stock ON s_i_id=ol_i_id "
                "WHERE ol_d_id=? AND ol_o_id>=? AND ol_o_id<? AND s_quantity<?",
                (d, nxt - 20, nxt, threshold),
            ).fetchone()

    mix = [(45, new_order), (43, payment), (4, order_status), (4, delivery), (4, stock_level)]
    t0 = timed_start()
    for _ in range(n):
        r = rng.randrange(100)
        for weight, fn in mix:
            if r < weight:
                fn()
                counts[fn.__name__] += 1
                break
            r -= weight
    secs = timed_end(t0)
    (orders1,) = conn.execute("SELECT count(*) FROM orders").fetchone()
    if orders1 != orders0 + counts["new_order"]:
        fail(f"{orders1} orders, want {orders0 + counts['new_order']}")
    (nxt_sum,) = conn.execute("SELECT sum(d_next_o_id - 1) FROM district").fetchone()
    (max_sum,) = conn.execute("SELECT sum(m) FROM (SELECT max(o_id) m FROM orders GROUP BY o_d_id)").fetchone()
    if nxt_sum != max_sum:
        fail("district next order ids disagree with the orders")
    if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
        fail("quick_check")
    print(json.dumps({"seconds": secs, "ops": n, "mix": counts}))
