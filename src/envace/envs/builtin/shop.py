"""``shop``: a small catalog and one customer's orders: search, place, look up, cancel, refund.

State: ``{"catalog": {product_id: {"name", "price_cents", "stock"}}, "orders": {order_id: {"product_id",
"quantity", "total_cents", "status"}}, "next_order": int}``. Statuses: pending -> shipped -> delivered, or
cancelled (from pending, restocks), or refunded (from delivered).
"""
from __future__ import annotations

import random
from typing import Any

from ..base import ToolError
from .common import Domain, TaskBuilder, ToolEnv, money, tool

ORDER_ID = {"type": "string", "description": "e.g. O-1001"}
STATUSES = ["pending", "shipped", "delivered", "cancelled", "refunded"]


class ShopEnv(ToolEnv):
    domain = "shop"
    system_prompt = (
        "You are a shop assistant for one customer. Use the tools to find products and to place, check, cancel "
        "or refund their orders. Prices are in dollars. Do only what the user asks, then answer in one short sentence."
    )

    def _order(self, order_id: str) -> dict[str, Any]:
        o = self.s["orders"].get(order_id)
        if o is None:
            raise ToolError(f"no order {order_id!r}")
        return o

    def _view(self, oid: str) -> dict[str, Any]:
        o = self.s["orders"][oid]
        return {"order_id": oid, "product": self.s["catalog"][o["product_id"]]["name"], "quantity": o["quantity"], "total": money(o["total_cents"]), "status": o["status"]}

    @tool("Find products whose name contains the query.", {"query": {"type": "string"}})
    def search_products(self, query: str) -> dict[str, Any]:
        q = query.strip().lower()
        hits = [{"product_id": pid, "name": p["name"], "price": money(p["price_cents"]), "stock": p["stock"]}
                for pid, p in sorted(self.s["catalog"].items()) if q and (q in p["name"] or p["name"] in q)]
        return {"products": hits}

    @tool("List the customer's orders, optionally only those with a status.", {"status": {"type": "string", "enum": STATUSES}}, optional=("status",))
    def list_orders(self, status: str | None = None) -> dict[str, Any]:
        return {"orders": [self._view(oid) for oid in sorted(self.s["orders"]) if status is None or self.s["orders"][oid]["status"] == status]}

    @tool("Get one order.", {"order_id": ORDER_ID})
    def get_order(self, order_id: str) -> dict[str, Any]:
        self._order(order_id)
        return self._view(order_id)

    @tool("Order a product.", {"product_id": {"type": "string", "description": "e.g. P-101"}, "quantity": {"type": "integer", "minimum": 1}}, mutates=True)
    def place_order(self, product_id: str, quantity: int) -> dict[str, Any]:
        p = self.s["catalog"].get(product_id)
        if p is None:
            raise ToolError(f"no product {product_id!r}")
        if p["stock"] < quantity:
            raise ToolError(f"only {p['stock']} {p['name']} in stock")
        p["stock"] -= quantity
        oid = f"O-{self.s['next_order']}"
        self.s["next_order"] += 1
        self.s["orders"][oid] = {"product_id": product_id, "quantity": quantity, "total_cents": p["price_cents"] * quantity, "status": "pending"}
        return self._view(oid)

    @tool("Cancel an order that has not shipped.", {"order_id": ORDER_ID}, mutates=True)
    def cancel_order(self, order_id: str) -> dict[str, Any]:
        o = self._order(order_id)
        if o["status"] != "pending":
            raise ToolError(f"order {order_id} cannot be cancelled: it is {o['status']}")
        o["status"] = "cancelled"
        self.s["catalog"][o["product_id"]]["stock"] += o["quantity"]
        return self._view(order_id)

    @tool("Refund a delivered order.", {"order_id": ORDER_ID}, mutates=True)
    def request_refund(self, order_id: str) -> dict[str, Any]:
        o = self._order(order_id)
        if o["status"] != "delivered":
            raise ToolError(f"order {order_id} cannot be refunded: it is {o['status']}")
        o["status"] = "refunded"
        return {**self._view(order_id), "refund": money(o["total_cents"])}

    def outcome_state(self) -> dict[str, Any]:
        # new order ids depend on the order of placement: compare orders as a sorted list without ids, but
        # keep the ids of orders that existed at the start (cancelling the wrong one must count)
        initial = set(self.task.env_config.get("orders", {}))
        old = {oid: o for oid, o in self.s["orders"].items() if oid in initial}
        new = sorted((o["product_id"], o["quantity"], o["total_cents"], o["status"]) for oid, o in self.s["orders"].items() if oid not in initial)
        return {"catalog": self.state()["catalog"], "orders": old, "new_orders": [list(x) for x in new]}


SHOP = Domain(ShopEnv)

# ----------------------------------------------------------------------------------------------- world

PRODUCTS = [
    "blue mug", "desk lamp", "usb cable", "notebook", "water bottle", "headphones", "phone case", "backpack",
    "pencil set", "yoga mat", "coffee beans", "tea kettle", "wall clock", "mouse pad", "sun hat", "rain jacket",
    "candle", "plant pot", "bike light", "board game",
]


def world(rng: random.Random, statuses: tuple[str, ...] = ()) -> dict[str, Any]:
    """4-6 products and 2-4 earlier orders; ``statuses`` are guaranteed among the orders' statuses."""
    names = rng.sample(PRODUCTS, rng.randint(4, 6))
    ids = rng.sample(range(100, 1000), len(names))
    catalog = {f"P-{i}": {"name": n, "price_cents": rng.randrange(3, 120) * 100 + rng.choice([0, 50, 99]), "stock": rng.randint(2, 15)} for i, n in zip(ids, names)}
    pids = sorted(catalog)
    want = list(statuses) + [rng.choice(["pending", "shipped", "delivered", "cancelled"]) for _ in range(rng.randint(2, 4) - len(statuses))]
    rng.shuffle(want)
    start = rng.randrange(1001, 9000)
    orders = {}
    for k, st in enumerate(want):
        pid, q = rng.choice(pids), rng.randint(1, 3)
        orders[f"O-{start + k}"] = {"product_id": pid, "quantity": q, "total_cents": catalog[pid]["price_cents"] * q, "status": st}
    return {"catalog": catalog, "orders": orders, "next_order": start + len(want)}


def products(b: TaskBuilder) -> list[str]:
    return sorted(b.env.s["catalog"])


def orders_with(b: TaskBuilder, status: str) -> list[str]:
    return sorted(oid for oid, o in b.env.s["orders"].items() if o["status"] == status)


def name(b: TaskBuilder, pid: str) -> str:
    return b.env.s["catalog"][pid]["name"]


def plausible(b: TaskBuilder, rng: random.Random) -> None:
    """Suggest reference calls: a search, an order lookup, sometimes a lookup of a missing order."""
    b.suggest("search_products", query=name(b, rng.choice(products(b))).split()[-1])
    b.suggest("get_order", order_id=rng.choice(sorted(b.env.s["orders"])))
    if rng.random() < 0.3:
        b.suggest("get_order", order_id=f"O-{rng.randrange(100, 1000)}")
    if rng.random() < 0.3:
        b.suggest("list_orders", status=rng.choice(["pending", "delivered"]))


# ----------------------------------------------------------------------------------------------- templates


@SHOP.template("price_question")
def _price_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    n = name(b, rng.choice(products(b)))
    b.user(rng.choice([f"How much does the {n} cost?", f"What is the price of a {n}?"]))
    o = b.call("search_products", query=n, check_keys=())
    price = next(p["price"] for p in o["products"] if p["name"] == n)
    b.reply(f"The {n} costs ${price}.", expect=[price])
    plausible(b, rng)
    return b


@SHOP.template("order_status_question")
def _order_status_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    oid = rng.choice(sorted(b.env.s["orders"]))
    b.user(rng.choice([f"What is the status of order {oid}?", f"Where is my order {oid}?"]))
    o = b.call("get_order", order_id=oid)
    b.reply(f"Order {oid} ({o['product']}) is {o['status']}.", expect=[o["status"]])
    plausible(b, rng)
    return b


PENDING_QUESTIONS = [
    "Which of my orders are still pending? Give me their order ids.",
    "List the ids of my pending orders.",
    "What orders of mine have not shipped yet? I need the order ids.",
    "Do I have pending orders? Tell me their ids.",
    "Show me the order ids of everything that is still pending.",
    "Which orders are pending right now? Please give the ids.",
    "I need the ids of my orders that are still pending.",
    "Tell me which of my orders are pending, by order id.",
]


@SHOP.template("pending_orders_question")
def _pending_orders_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("pending",)), rng)
    b.user(rng.choice(PENDING_QUESTIONS))
    o = b.call("list_orders", status="pending", check_keys=())
    ids = [x["order_id"] for x in o["orders"]]
    b.reply(f"Pending orders: {', '.join(ids)}.", expect=ids)
    plausible(b, rng)
    return b


@SHOP.template("buy_by_id")
def _buy_by_id(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pid = rng.choice(products(b))
    q = rng.randint(1, min(3, b.env.s["catalog"][pid]["stock"]))
    b.user(rng.choice([f"Please order {q} of product {pid} ({name(b, pid)}).", f"Buy {q} x {pid} for me."]))
    o = b.call("place_order", product_id=pid, quantity=q)
    b.reply(f"Ordered {q} {name(b, pid)}: order {o['order_id']}, total ${o['total']}.", expect=[o["order_id"]])
    plausible(b, rng)
    return b


@SHOP.template("buy_by_name")
def _buy_by_name(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pid = rng.choice(products(b))
    n, q = name(b, pid), rng.randint(1, min(3, b.env.s["catalog"][pid]["stock"]))
    b.user(rng.choice([f"I want to buy {q} {n}. Please order it.", f"Order {q} of the {n} for me."]))
    b.call("search_products", query=n, check_keys=())
    o = b.call("place_order", product_id=pid, quantity=q)
    b.reply(f"Ordered {q} {n} for ${o['total']} (order {o['order_id']}).")
    plausible(b, rng)
    return b


@SHOP.template("cancel")
def _cancel(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("pending",)), rng)
    oid = rng.choice(orders_with(b, "pending"))
    b.user(rng.choice([f"Please cancel order {oid}.", f"I changed my mind, cancel {oid}."]))
    b.call("cancel_order", order_id=oid)
    b.reply(f"Order {oid} is cancelled.")
    plausible(b, rng)
    return b


@SHOP.template("cancel_shipped")
def _cancel_shipped(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("shipped",)), rng)
    oid = rng.choice(orders_with(b, "shipped"))
    b.user(f"Cancel my order {oid}.")
    b.call("cancel_order", fails=True, order_id=oid)
    b.reply(f"Order {oid} cannot be cancelled because it has already shipped.", expect=["shipped"])
    b.check("Does not refund the order instead", {"type": "not_called", "tool": "request_refund"})
    plausible(b, rng)
    return b


@SHOP.template("refund")
def _refund(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("delivered",)), rng)
    oid = rng.choice(orders_with(b, "delivered"))
    b.user(rng.choice([f"Order {oid} arrived broken. Please refund it.", f"I want a refund for order {oid}."]))
    o = b.call("request_refund", order_id=oid)
    b.reply(f"Order {oid} is refunded: ${o['refund']}.", expect=[o["refund"]])
    plausible(b, rng)
    return b


@SHOP.template("status_then_cancel")
def _status_then_cancel(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("pending",)), rng)
    oid = rng.choice(orders_with(b, "pending"))
    b.user(f"Has my order {oid} shipped yet?")
    o = b.call("get_order", order_id=oid)
    b.reply(f"No, order {oid} is still pending.", expect=["pending"])
    b.user("Then please cancel it.")
    b.call("cancel_order", order_id=oid)
    b.reply(f"Order {oid} is cancelled.")
    plausible(b, rng)
    return b


@SHOP.template("price_then_buy")
def _price_then_buy(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pid = rng.choice(products(b))
    n = name(b, pid)
    b.user(f"How much is the {n}?")
    o = b.call("search_products", query=n, check_keys=())
    price = next(p["price"] for p in o["products"] if p["name"] == n)
    b.reply(f"The {n} ({pid}) costs ${price}.", expect=[price])
    q = rng.randint(1, min(3, b.env.s["catalog"][pid]["stock"]))
    b.user(f"Great, order {q} of them.")
    o = b.call("place_order", product_id=pid, quantity=q)
    b.reply(f"Ordered {q} {n}: order {o['order_id']}, total ${o['total']}.")
    plausible(b, rng)
    return b


@SHOP.template("buy_two")
def _buy_two(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    p1, p2 = rng.sample(products(b), 2)
    q1, q2 = rng.randint(1, 2), rng.randint(1, 2)
    b.user(f"Order {q1} of {p1} and {q2} of {p2}.")
    b.call("place_order", product_id=p1, quantity=q1)
    b.call("place_order", product_id=p2, quantity=q2)
    b.reply(f"Placed both orders: {q1} {name(b, p1)} and {q2} {name(b, p2)}.")
    plausible(b, rng)
    return b


@SHOP.template("out_of_stock")
def _out_of_stock(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pid = rng.choice(products(b))
    q = b.env.s["catalog"][pid]["stock"] + rng.randint(1, 10)
    b.user(f"Order {q} of product {pid}.")
    b.call("place_order", fails=True, product_id=pid, quantity=q)
    left = b.env.s["catalog"][pid]["stock"]
    b.reply(f"I could not order {q}: only {left} {name(b, pid)} are in stock.", expect=["stock"])
    plausible(b, rng)
    return b


@SHOP.template("replace_order")
def _replace_order(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("pending",)), rng)
    oid = rng.choice(orders_with(b, "pending"))
    b.user(f"What did I order in {oid}?")
    o = b.call("get_order", order_id=oid)
    b.reply(f"Order {oid} is {o['quantity']} {o['product']}, ${o['total']}, {o['status']}.", expect=[o["product"]])
    old_pid = b.env.s["orders"][oid]["product_id"]
    new_pid = rng.choice([p for p in products(b) if p != old_pid])
    n = name(b, new_pid)
    b.user(f"Cancel it and order 1 {n} instead.")
    b.call("cancel_order", order_id=oid)
    b.call("search_products", query=n, check_keys=())
    o2 = b.call("place_order", product_id=new_pid, quantity=1)
    b.reply(f"Cancelled {oid} and ordered 1 {n} (order {o2['order_id']}).")
    b.user(f"And what's the status of {oid} now?")
    b.call("get_order", order_id=oid)
    b.reply(f"Order {oid} is cancelled.", expect=["cancelled"])
    plausible(b, rng)
    return b
