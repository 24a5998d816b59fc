"""``shop``: a small catalog and one customer's orders: search, place, look up, cancel, refund.

State: ``{"catalog": {product_id: {"name", "price_cents", "stock"}}, "orders": {order_id: {"product_id",
"quantity", "total_cents", "status"}}, "next_order": int}``. Statuses: pending -> shipped -> delivered, or
cancelled (from pending, restocks), or refunded (from delivered).

Splits: train/test catalogs draw product names from :data:`PRODUCTS` with the in-distribution templates; ``ood``
catalogs draw them from :data:`OOD_PRODUCTS` with the ``ood_*`` templates (cheaper of two, reorder what an order
held, refund by product, cancel else refund, order what is left, cancel two, status then refund).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ..base import ToolError
from .common import Domain, GenerationError, TaskBuilder, ToolEnv, money, persistent_world, tool

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
        return {
            "order_id": oid,
            "product": self.s["catalog"][o["product_id"]]["name"],
            "quantity": o["quantity"],
            "total": money(o["total_cents"]),
            "status": o["status"],
        }

    @tool("Find products whose name contains the query.", {"query": {"type": "string"}})
    def search_products(self, query: str) -> dict[str, Any]:
        q = query.strip().lower()
        hits = [
            {"product_id": pid, "name": p["name"], "price": money(p["price_cents"]), "stock": p["stock"]}
            for pid, p in sorted(self.s["catalog"].items())
            if q and (q in p["name"] or p["name"] in q)
        ]
        return {"products": hits}

    @tool(
        "List the customer's orders, optionally only those with a status.",
        {"status": {"type": "string", "enum": STATUSES}},
        optional=("status",),
    )
    def list_orders(self, status: str | None = None) -> dict[str, Any]:
        return {
            "orders": [
                self._view(oid)
                for oid in sorted(self.s["orders"])
                if status is None or self.s["orders"][oid]["status"] == status
            ]
        }

    @tool("Get one order.", {"order_id": ORDER_ID})
    def get_order(self, order_id: str) -> dict[str, Any]:
        self._order(order_id)
        return self._view(order_id)

    @tool(
        "Order a product.",
        {"product_id": {"type": "string", "description": "e.g. P-101"}, "quantity": {"type": "integer", "minimum": 1}},
        mutates=True,
    )
    def place_order(self, product_id: str, quantity: int) -> dict[str, Any]:
        p = self.s["catalog"].get(product_id)
        if p is None:
            raise ToolError(f"no product {product_id!r}")
        if p["stock"] < quantity:
            raise ToolError(f"only {p['stock']} {p['name']} in stock")
        p["stock"] -= quantity
        oid = f"O-{self.s['next_order']}"
        self.s["next_order"] += 1
        self.s["orders"][oid] = {
            "product_id": product_id,
            "quantity": quantity,
            "total_cents": p["price_cents"] * quantity,
            "status": "pending",
        }
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
        new = sorted(
            (o["product_id"], o["quantity"], o["total_cents"], o["status"])
            for oid, o in self.s["orders"].items()
            if oid not in initial
        )
        return {"catalog": self.state()["catalog"], "orders": old, "new_orders": [list(x) for x in new]}


# ----------------------------------------------------------------------------------------------- world

PRODUCTS = [
    "blue mug",
    "desk lamp",
    "usb cable",
    "notebook",
    "water bottle",
    "headphones",
    "phone case",
    "backpack",
    "pencil set",
    "yoga mat",
    "coffee beans",
    "tea kettle",
    "wall clock",
    "mouse pad",
    "sun hat",
    "rain jacket",
    "candle",
    "plant pot",
    "bike light",
    "board game",
]
# held out: only the ood split's catalogs use these (no word in common with PRODUCTS, none inside another)
OOD_PRODUCTS = [
    "saucepan",
    "floor rug",
    "hdmi adapter",
    "sketchbook",
    "thermos",
    "earbuds",
    "laptop stand",
    "tote bag",
    "crayon box",
    "jump rope",
    "cocoa powder",
    "wok",
    "wind chime",
    "stapler",
    "beanie",
    "umbrella",
    "incense",
    "seed packet",
    "scarf",
    "puzzle",
]


def entities(config: dict[str, Any]) -> set[str]:
    """Product names of an initial state's catalog."""
    return {p["name"] for p in config["catalog"].values()}


SHOP = Domain(ShopEnv, pools={"products": (PRODUCTS, OOD_PRODUCTS)}, entities=entities)


def world(
    rng: random.Random,
    statuses: tuple[str, ...] = (),
    pool: list[str] = PRODUCTS,
    catalog_rng: random.Random | None = None,
) -> dict[str, Any]:
    """4-6 products and 2-4 earlier orders; ``statuses`` are guaranteed among the orders' statuses. In a persistent
    suite the record of a customer with at least those orders; ``catalog_rng`` draws the catalog (the same one for
    every customer of ``shop-world``), else ``rng``."""
    if (w := persistent_world(rng, lambda w: _has_statuses(w, statuses))) is not None:
        return w
    crng = catalog_rng or rng
    names = crng.sample(pool, crng.randint(4, 6))
    ids = crng.sample(range(100, 1000), len(names))
    catalog = {
        f"P-{i}": {
            "name": n,
            "price_cents": crng.randrange(3, 120) * 100 + crng.choice([0, 50, 99]),
            "stock": crng.randint(2, 15),
        }
        for i, n in zip(ids, names)
    }
    pids = sorted(catalog)
    want = list(statuses) + [
        rng.choice(["pending", "shipped", "delivered", "cancelled"]) for _ in range(rng.randint(2, 4) - len(statuses))
    ]
    rng.shuffle(want)
    start = rng.randrange(1001, 9000)
    orders = {}
    for k, st in enumerate(want):
        pid, q = rng.choice(pids), rng.randint(1, 3)
        orders[f"O-{start + k}"] = {
            "product_id": pid,
            "quantity": q,
            "total_cents": catalog[pid]["price_cents"] * q,
            "status": st,
        }
    return {"catalog": catalog, "orders": orders, "next_order": start + len(want)}


def ood_world(rng: random.Random, statuses: tuple[str, ...] = ()) -> dict[str, Any]:
    """A world of the ood split: a catalog of held-out product names."""
    return world(rng, statuses, pool=OOD_PRODUCTS)


def _has_statuses(w: dict[str, Any], statuses: tuple[str, ...]) -> bool:
    have = Counter(o["status"] for o in w["orders"].values())
    return all(have[st] >= k for st, k in Counter(statuses).items())


# the earlier orders every customer of shop-world is guaranteed, by customer index mod 4: each template fits some
CUSTOMER_ORDERS: tuple[tuple[str, ...], ...] = (("pending", "pending"), ("shipped",), ("delivered",), ("pending",))


def customer(rng: random.Random, i: int, pool: list[str] = PRODUCTS, catalog: str = "shop-world") -> dict[str, Any]:
    """The record of customer ``i`` of ``shop-world``: its orders from the one fixed catalog of the suite (the
    catalog's stock and prices are the same for every customer; each task still starts from a fresh copy)."""
    return world(rng, CUSTOMER_ORDERS[i % 4], pool, catalog_rng=random.Random(f"{catalog}/catalog"))


SHOP_WORLD = SHOP.persistent(customer, lambda rng, i: customer(rng, i, OOD_PRODUCTS, "shop-world/ood"))
"""``shop-world``: the shop's tools and templates on one fixed catalog and the orders of a few customers."""


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
    b.call("get_order", order_id=oid)
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


# ----------------------------------------------------------------------------------------------- ood templates
# Held out for the ood split (ood=True): other task structures and phrasings, on catalogs of held-out names.


def price(b: TaskBuilder, pid: str) -> str:
    return money(b.env.s["catalog"][pid]["price_cents"])


def two_prices(b: TaskBuilder, rng: random.Random) -> tuple[str, str, str, str]:
    """Two products drawn from the catalog, then the cheaper and the dearer of them; GenerationError when both
    cost the same."""
    p1, p2 = rng.sample(products(b), 2)
    c1, c2 = b.env.s["catalog"][p1]["price_cents"], b.env.s["catalog"][p2]["price_cents"]
    if c1 == c2:
        raise GenerationError("both products cost the same")
    return (p1, p2, p1, p2) if c1 < c2 else (p1, p2, p2, p1)


@SHOP.template("ood_cheaper_of_two", ood=True)
def _ood_cheaper_of_two(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng), rng)
    p1, p2, cheap, dear = two_prices(b, rng)
    n1, n2 = name(b, p1), name(b, p2)
    b.user(rng.choice([f"Which is cheaper, the {n1} or the {n2}?", f"Between a {n1} and a {n2}, which costs less?"]))
    b.call("search_products", query=n1, check_keys=())
    b.call("search_products", query=n2, check_keys=())
    b.reply(f"The {name(b, cheap)} is cheaper: ${price(b, cheap)} against ${price(b, dear)}.", expect=[price(b, cheap)])
    plausible(b, rng)
    return b


@SHOP.template("ood_reorder_same", ood=True)
def _ood_reorder_same(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng), rng)
    oid = rng.choice(sorted(b.env.s["orders"]))
    pid = b.env.s["orders"][oid]["product_id"]
    q = rng.randint(1, min(3, b.env.s["catalog"][pid]["stock"]))
    b.user(
        rng.choice(
            [
                f"Order {q} more of whatever I bought in order {oid}.",
                f"I liked what came in {oid}; buy {q} more of that product.",
            ]
        )
    )
    o = b.call("get_order", order_id=oid)
    b.call("search_products", query=o["product"], check_keys=())
    o2 = b.call("place_order", product_id=pid, quantity=q)
    b.reply(
        f"Order {oid} was {o['product']}; I ordered {q} more (order {o2['order_id']}, ${o2['total']}).",
        expect=[o2["order_id"]],
    )
    plausible(b, rng)
    return b


@SHOP.template("ood_refund_by_product", ood=True)
def _ood_refund_by_product(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng, statuses=("delivered",)), rng)
    delivered = orders_with(b, "delivered")
    by_product: dict[str, list[str]] = {}
    for oid in delivered:
        by_product.setdefault(b.env.s["orders"][oid]["product_id"], []).append(oid)
    single = sorted(ids[0] for ids in by_product.values() if len(ids) == 1)
    if not single:
        raise GenerationError("every delivered product came in two orders")
    oid = rng.choice(single)
    n = name(b, b.env.s["orders"][oid]["product_id"])
    b.user(
        rng.choice(
            [
                f"The {n} I received is broken. Please refund that order.",
                f"My delivered {n} does not work; get me my money back for it.",
            ]
        )
    )
    b.call("list_orders", status="delivered", check_keys=())
    o = b.call("request_refund", order_id=oid)
    b.reply(f"Refunded order {oid} ({n}): ${o['refund']}.", expect=[o["refund"]])
    plausible(b, rng)
    return b


@SHOP.template("ood_cancel_else_refund", ood=True)
def _ood_cancel_else_refund(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng, statuses=("delivered",)), rng)
    oid = rng.choice(orders_with(b, "delivered"))
    b.user(f"Cancel order {oid}. If it is too late for that, refund it instead.")
    b.call("cancel_order", fails=True, order_id=oid)
    o = b.call("request_refund", order_id=oid)
    b.reply(f"Order {oid} was already delivered, so I refunded it: ${o['refund']}.", expect=[o["refund"]])
    plausible(b, rng)
    return b


@SHOP.template("ood_order_what_is_left", ood=True)
def _ood_order_what_is_left(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng), rng)
    pid = rng.choice(products(b))
    stock = b.env.s["catalog"][pid]["stock"]
    q = stock + rng.randint(1, 5)
    b.user(f"Order {q} of product {pid}. If you do not have that many, order all you have.")
    b.call("place_order", fails=True, product_id=pid, quantity=q)
    o = b.call("place_order", product_id=pid, quantity=stock)
    b.reply(
        f"Only {stock} {name(b, pid)} were in stock, so I ordered all {stock} (order {o['order_id']}).",
        expect=[o["order_id"]],
    )
    plausible(b, rng)
    return b


@SHOP.template("ood_cancel_two", ood=True)
def _ood_cancel_two(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng, statuses=("pending", "pending")), rng)
    o1, o2 = rng.sample(orders_with(b, "pending"), 2)
    b.user(rng.choice([f"Cancel {o1} and {o2}, please.", f"I do not need orders {o1} and {o2} any more; cancel both."]))
    b.call("cancel_order", order_id=o1)
    b.call("cancel_order", order_id=o2)
    b.reply(f"Orders {o1} and {o2} are cancelled.")
    plausible(b, rng)
    return b


@SHOP.template("ood_status_then_refund", ood=True)
def _ood_status_then_refund(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, ood_world(rng, statuses=("delivered",)), rng)
    oid = rng.choice(orders_with(b, "delivered"))
    b.user(f"Has order {oid} arrived?")
    o = b.call("get_order", order_id=oid)
    b.reply(f"Yes, order {oid} ({o['product']}) was delivered.", expect=["delivered"])
    b.user("It came damaged. Refund it, please.")
    o2 = b.call("request_refund", order_id=oid)
    b.reply(f"Order {oid} is refunded: ${o2['refund']}.", expect=[o2["refund"]])
    plausible(b, rng)
    return b


# ----------------------------------------------------------------------------------------------- shop-world-decide
# Requests whose right action depends on what the tools return (a price against a limit, which of two products is
# cheaper, how many orders are pending, an order's total against a limit), on shop-world's customers and catalog.
# In every one, acting without reading the world changes the outcome (an order placed above the limit, the dearer
# product bought, a pending order left or an order cancelled that should stay), and what the tools return is a
# fixed function of the persistent world: a Rehearse that has learnt it lets Act decide in imagination as it would
# in the real shop; one that imagines a wrong price or status leads Act into a wrong action, which the replayed
# outcome then scores as a failure for both roles.

SHOP_DECIDE = Domain(ShopEnv, pools=SHOP.pools, entities=entities)
"""The decision templates (and, for the ``ood`` split, the shop's held-out templates); registered only as the
persistent suite :data:`SHOP_WORLD_DECIDE`."""


def dollars_below(cents: int, rng: random.Random) -> int:
    """A whole-dollar limit the amount is not above (``cents <= 100 * limit``), 0-15 dollars over it."""
    return -(-cents // 100) + rng.randint(0, 15)


def dollars_under(cents: int, rng: random.Random) -> int:
    """A whole-dollar limit, at least $1, that the amount is strictly above; GenerationError when none is."""
    limit = (cents - 1) // 100 - rng.randint(0, 15)
    if limit < 1:
        limit = (cents - 1) // 100
    if limit < 1:
        raise GenerationError(f"no whole-dollar limit below {money(cents)}")
    return limit


@SHOP_DECIDE.template("buy_if_under")
def _buy_if_under(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pid = rng.choice(products(b))
    n, cents = name(b, pid), b.env.s["catalog"][pid]["price_cents"]
    q = rng.randint(1, min(2, b.env.s["catalog"][pid]["stock"]))
    buy = rng.random() < 0.5
    limit = dollars_below(cents, rng) + (1 if cents % 100 == 0 else 0) if buy else dollars_under(cents, rng)
    if (cents < 100 * limit) != buy:
        raise GenerationError("the limit does not decide as drawn")
    b.user(
        rng.choice(
            [
                f"Order {q} {n} if it costs less than ${limit} each. If not, do not order; just tell me the price.",
                f"Buy {q} of the {n}, but only if the price is under ${limit}. Otherwise tell me what it costs.",
                f"If the {n} is cheaper than ${limit}, order {q} for me; if it is not, only tell me its price.",
            ]
        )
    )
    o = b.call("search_products", query=n, check_keys=())
    p = next(x["price"] for x in o["products"] if x["name"] == n)
    if buy:
        o2 = b.call("place_order", product_id=pid, quantity=q)
        b.reply(f"The {n} costs ${p}, under ${limit}, so I ordered {q} (order {o2['order_id']}).", expect=[p])
    else:
        b.reply(f"The {n} costs ${p}, which is not under ${limit}, so I did not order it.", expect=[p])
    plausible(b, rng)
    return b


@SHOP_DECIDE.template("buy_cheaper")
def _buy_cheaper(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    p1, p2, cheap, dear = two_prices(b, rng)
    n1, n2 = name(b, p1), name(b, p2)
    b.user(
        rng.choice(
            [
                f"Order one {n1} or one {n2}, whichever is cheaper.",
                f"I need either a {n1} or a {n2}. Buy one of the cheaper of the two.",
                f"Compare the {n1} and the {n2} and order one of whichever costs less.",
            ]
        )
    )
    b.call("search_products", query=n1, check_keys=())
    b.call("search_products", query=n2, check_keys=())
    o = b.call("place_order", product_id=cheap, quantity=1)
    b.reply(
        f"The {name(b, cheap)} is cheaper (${price(b, cheap)} against ${price(b, dear)}): I ordered one "
        f"(order {o['order_id']}).",
        expect=[price(b, cheap)],
    )
    plausible(b, rng)
    return b


MAX_PENDING_CANCELS = 2  # cancel_pending's customers have at most this many pending orders (rollouts' step limits)


@SHOP_DECIDE.template("cancel_pending")
def _cancel_pending(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng), rng)
    pending = orders_with(b, "pending")
    if len(pending) > MAX_PENDING_CANCELS:
        raise GenerationError(f"{len(pending)} pending orders: more cancels than a turn's steps")
    b.split_by_customer = True
    b.user(
        rng.choice(
            [
                "Cancel all of my orders that have not shipped yet.",
                "Please cancel every pending order I have.",
                "I want none of my pending orders any more: cancel them all.",
                "Cancel whatever I have that is still pending.",
            ]
        )
    )
    b.call("list_orders", status="pending", check_keys=())
    for oid in pending:
        b.call("cancel_order", order_id=oid)
    if pending:
        b.reply(f"Cancelled {', '.join(pending)}.", expect=pending)
    else:
        b.reply("You have no pending orders, so there was nothing to cancel.")
    plausible(b, rng)
    return b


@SHOP_DECIDE.template("cancel_if_over")
def _cancel_if_over(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(ShopEnv, world(rng, statuses=("pending",)), rng)
    oid = rng.choice(orders_with(b, "pending"))
    cents = b.env.s["orders"][oid]["total_cents"]
    cancel = rng.random() < 0.5
    limit = dollars_under(cents, rng) if cancel else dollars_below(cents, rng)
    b.user(
        rng.choice(
            [
                f"If order {oid} comes to more than ${limit}, cancel it. Otherwise leave it as it is.",
                f"Cancel order {oid} only if its total is over ${limit}; if not, keep it.",
                f"Check order {oid}: if it costs more than ${limit} in total, cancel it, else do nothing.",
            ]
        )
    )
    o = b.call("get_order", order_id=oid)
    if cancel:
        b.call("cancel_order", order_id=oid)
        b.reply(f"Order {oid} comes to ${o['total']}, over ${limit}, so I cancelled it.", expect=[o["total"]])
    else:
        b.reply(f"Order {oid} comes to ${o['total']}, not over ${limit}, so I left it.", expect=[o["total"]])
    plausible(b, rng)
    return b


for _held in sorted(SHOP.held_out):  # the ood split: the shop's held-out templates, on the ood customers
    SHOP_DECIDE.templates.add(_held, SHOP.templates.get(_held))
    SHOP_DECIDE.held_out.add(_held)

SHOP_WORLD_DECIDE = SHOP_DECIDE.persistent(
    customer,
    lambda rng, i: customer(rng, i, OOD_PRODUCTS, "shop-world/ood"),
    suite="shop-world-decide",
    world="shop-world",
)
"""``shop-world-decide``: shop-world's customers and catalog (the same records), with requests whose right action
depends on a price, a status or a total that the tools return: ``buy_if_under``, ``buy_cheaper``,
``cancel_pending``, ``cancel_if_over``. Its ``ood`` split is shop-world's (held-out templates and customers)."""
