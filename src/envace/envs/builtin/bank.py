"""``bank``: one customer's named accounts, balances, transfers, deposits, transaction history, freezing.

State: ``{"accounts": {name: {"balance_cents": int, "frozen": bool}}, "transactions": [{"id", "account",
"amount_cents", "memo"}], "next_txn": int}``. Money is integer cents inside and "142.50" strings outside.

Splits: train/test draw accounts from :data:`NAMES` and memos from :data:`MEMOS` with the in-distribution
templates; ``ood`` draws them from :data:`OOD_NAMES` / :data:`OOD_MEMOS` with the ``ood_*`` templates (combined
balance, undo the last payment, top up from the largest account, transfer with a fallback account, two deposits,
history then freeze).
"""

from __future__ import annotations

import random
from typing import Any

from ..base import ToolError
from .common import Domain, GenerationError, TaskBuilder, ToolEnv, cents, money, persistent_world, tool

ACCOUNT = {"type": "string", "description": "account name"}
AMOUNT = {"type": "number", "description": "dollars"}


class BankEnv(ToolEnv):
    domain = "bank"
    system_prompt = (
        "You are a bank assistant for one customer. Use the tools to look up or change their accounts. "
        "Amounts are in dollars. Do only what the user asks, then answer in one short sentence with the key facts."
    )

    def _acct(self, name: str) -> dict[str, Any]:
        acct = self.s["accounts"].get(name)
        if acct is None:
            raise ToolError(f"no account named {name!r}; accounts: {', '.join(sorted(self.s['accounts']))}")
        return acct

    def _amount(self, amount: float) -> int:
        c = cents(amount)
        if c <= 0:
            raise ToolError("amount must be positive")
        return c

    def _record(self, account: str, amount_cents: int, memo: str) -> str:
        tid = f"T-{self.s['next_txn']:04d}"
        self.s["next_txn"] += 1
        self.s["transactions"].append({"id": tid, "account": account, "amount_cents": amount_cents, "memo": memo})
        return tid

    @tool("List all accounts with balances and the total.")
    def list_accounts(self) -> dict[str, Any]:
        accts = [
            {"account": n, "balance": money(a["balance_cents"]), "frozen": a["frozen"]}
            for n, a in sorted(self.s["accounts"].items())
        ]
        return {"accounts": accts, "total": money(sum(a["balance_cents"] for a in self.s["accounts"].values()))}

    @tool("Get the balance of one account.", {"account": ACCOUNT})
    def get_balance(self, account: str) -> dict[str, Any]:
        a = self._acct(account)
        return {"account": account, "balance": money(a["balance_cents"]), "frozen": a["frozen"]}

    @tool(
        "Recent transactions of an account, newest first.",
        {"account": ACCOUNT, "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
        optional=("limit",),
    )
    def get_transactions(self, account: str, limit: int = 5) -> dict[str, Any]:
        self._acct(account)
        txns = [t for t in self.s["transactions"] if t["account"] == account][::-1][:limit]
        return {
            "account": account,
            "transactions": [{"id": t["id"], "amount": money(t["amount_cents"]), "memo": t["memo"]} for t in txns],
        }

    @tool("Deposit money into an account.", {"account": ACCOUNT, "amount": AMOUNT}, mutates=True)
    def deposit(self, account: str, amount: float) -> dict[str, Any]:
        a, c = self._acct(account), self._amount(amount)
        a["balance_cents"] += c
        tid = self._record(account, c, "deposit")
        return {"account": account, "balance": money(a["balance_cents"]), "transaction_id": tid}

    @tool(
        "Move money between two accounts.",
        {"from_account": ACCOUNT, "to_account": ACCOUNT, "amount": AMOUNT},
        mutates=True,
    )
    def transfer(self, from_account: str, to_account: str, amount: float) -> dict[str, Any]:
        src, dst, c = self._acct(from_account), self._acct(to_account), self._amount(amount)
        if from_account == to_account:
            raise ToolError("cannot transfer to the same account")
        if src["frozen"]:
            raise ToolError(f"account {from_account} is frozen")
        if src["balance_cents"] < c:
            raise ToolError(f"insufficient funds: {from_account} has {money(src['balance_cents'])}")
        src["balance_cents"] -= c
        dst["balance_cents"] += c
        tid = self._record(from_account, -c, f"transfer to {to_account}")
        self._record(to_account, c, f"transfer from {from_account}")
        return {
            "amount": money(c),
            "from_balance": money(src["balance_cents"]),
            "to_balance": money(dst["balance_cents"]),
            "transaction_id": tid,
        }

    @tool("Freeze an account: no money can leave it.", {"account": ACCOUNT}, mutates=True)
    def freeze_account(self, account: str) -> dict[str, Any]:
        a = self._acct(account)
        if a["frozen"]:
            raise ToolError(f"account {account} is already frozen")
        a["frozen"] = True
        return {"account": account, "frozen": True}

    def outcome_state(self) -> dict[str, Any]:
        # transaction ids and the counter depend on the order of independent operations: ignore them
        txns = sorted((t["account"], t["amount_cents"], t["memo"]) for t in self.s["transactions"])
        return {"accounts": self.state()["accounts"], "transactions": [list(t) for t in txns]}


# ----------------------------------------------------------------------------------------------- world

NAMES = [
    "checking",
    "savings",
    "travel",
    "rent",
    "groceries",
    "emergency",
    "holiday",
    "car",
    "bills",
    "gifts",
    "school",
    "health",
    "pets",
    "garden",
]
MEMOS = [
    "coffee shop",
    "grocery store",
    "gym",
    "bookstore",
    "gas station",
    "pharmacy",
    "cinema",
    "bakery",
    "phone bill",
    "restaurant",
    "taxi",
    "hardware store",
]
# held out: only the ood split's worlds use these
OOD_NAMES = [
    "wedding",
    "tuition",
    "taxes",
    "utilities",
    "hobby",
    "fitness",
    "charity",
    "insurance",
    "mortgage",
    "business",
    "dining",
    "wardrobe",
    "repairs",
    "baby",
]
OOD_MEMOS = [
    "florist",
    "bike shop",
    "laundromat",
    "toy store",
    "music store",
    "parking garage",
    "dentist",
    "optician",
    "butcher",
    "theatre",
    "ferry",
    "newsstand",
]


def entities(config: dict[str, Any]) -> set[str]:
    """Account names and memos of an initial state."""
    return set(config["accounts"]) | {t["memo"] for t in config["transactions"]}


BANK = Domain(BankEnv, pools={"accounts": (NAMES, OOD_NAMES), "memos": (MEMOS, OOD_MEMOS)}, entities=entities)


def world(
    rng: random.Random,
    n_accounts: int | None = None,
    frozen: int = 0,
    names_pool: list[str] = NAMES,
    memos: list[str] = MEMOS,
) -> dict[str, Any]:
    """A few accounts with balances (``frozen`` of them frozen) and a short card history; in a persistent suite the
    record of a customer with ``n_accounts`` accounts (any number if None), at least ``frozen`` of them frozen."""
    if (
        w := persistent_world(
            rng,
            lambda w: (
                n_accounts in (None, len(w["accounts"])) and sum(a["frozen"] for a in w["accounts"].values()) >= frozen
            ),
        )
    ) is not None:
        return w
    names = rng.sample(names_pool, n_accounts or rng.randint(3, 4))
    accounts = {
        n: {"balance_cents": rng.randrange(40, 900) * 100 + rng.choice([0, 0, 50, rng.randrange(100)]), "frozen": False}
        for n in names
    }
    for n in names[:frozen]:
        accounts[n]["frozen"] = True
    txns = []
    for i in range(rng.randint(3, 6)):
        n = rng.choice(names)
        txns.append(
            {"id": f"T-{i + 1:04d}", "account": n, "amount_cents": -rng.randrange(150, 9000), "memo": rng.choice(memos)}
        )
    return {"accounts": accounts, "transactions": txns, "next_txn": len(txns) + 1}


def bal(b: TaskBuilder, name: str) -> int:
    return b.env.s["accounts"][name]["balance_cents"]


def draw(rng: random.Random, max_cents: int) -> tuple[float | int, str]:
    """An amount <= max_cents as (tool argument, text for the user): (20, "$20") or (35.5, "$35.50")."""
    top = max(1, max_cents // 100)
    whole = rng.randint(1, min(top, 400))
    if rng.random() < 0.6 or whole * 100 + 99 > max_cents:
        return whole, f"${whole}"
    c = whole * 100 + rng.choice([25, 50, 75, rng.randrange(1, 100)])
    return c / 100, f"${money(c)}"


def ood_world(rng: random.Random, n_accounts: int | None = None, frozen: int = 0) -> dict[str, Any]:
    """A world of the ood split: held-out account names and memos."""
    return world(rng, n_accounts, frozen, names_pool=OOD_NAMES, memos=OOD_MEMOS)


def customer(rng: random.Random, i: int, names_pool: list[str] = NAMES, memos: list[str] = MEMOS) -> dict[str, Any]:
    """The record of customer ``i`` of ``bank-world``: 3 or 4 accounts (alternately), every fourth customer with one
    frozen, so that every template finds a customer it fits."""
    return world(rng, n_accounts=3 + i % 2, frozen=int(i % 4 == 3), names_pool=names_pool, memos=memos)


BANK_WORLD = BANK.persistent(customer, lambda rng, i: customer(rng, i, OOD_NAMES, OOD_MEMOS))
"""``bank-world``: the bank's tools and templates on the persistent records of a few customers."""


def plausible(b: TaskBuilder, rng: random.Random, *avoid: str, pool: list[str] = NAMES) -> None:
    """Suggest reference calls: reads of other accounts and a call on a missing account (an error record)."""
    names = sorted(b.env.s["accounts"])
    others = [n for n in names if n not in avoid] or names
    b.suggest("get_balance", account=rng.choice(others))
    if rng.random() < 0.5:
        b.suggest("get_transactions", account=rng.choice(names), limit=2)
    if rng.random() < 0.3:
        b.suggest("get_balance", account=rng.choice([n for n in pool if n not in names]))


# ----------------------------------------------------------------------------------------------- templates
# Each template scripts one episode on a fresh world and returns the builder. User messages name every value.


@BANK.template("balance_question")
def _balance_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a = rng.choice(sorted(b.env.s["accounts"]))
    b.user(
        rng.choice(
            [f"What is the balance of my {a} account?", f"How much money is in {a}?", f"Check my {a} balance, please."]
        )
    )
    o = b.call("get_balance", account=a)
    b.reply(f"Your {a} account has ${o['balance']}.", expect=[o["balance"]])
    plausible(b, rng, a)
    return b


@BANK.template("total_question")
def _total_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    names = ", ".join(sorted(b.env.s["accounts"]))
    b.user(
        rng.choice(
            [
                f"How much money do I have in total across all my accounts ({names})?",
                f"What is the total balance of my accounts {names}?",
            ]
        )
    )
    o = b.call("list_accounts")
    b.reply(f"You have ${o['total']} in total.", expect=[o["total"]])
    plausible(b, rng)
    return b


@BANK.template("last_transaction_question")
def _last_transaction_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    used = sorted({t["account"] for t in b.env.s["transactions"]})
    a = rng.choice(used)
    b.user(
        rng.choice([f"What was the last transaction on my {a} account?", f"Show me the most recent payment from {a}."])
    )
    o = b.call("get_transactions", account=a, limit=1, check_keys=("account",))
    t = o["transactions"][0]
    amount = t["amount"].lstrip("-")
    b.reply(f"The last {a} transaction was {t['memo']} for ${amount}.", expect=[t["memo"], amount])
    plausible(b, rng, a)
    return b


@BANK.template("transfer")
def _transfer(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    amt, text = draw(rng, bal(b, a))
    b.user(
        rng.choice(
            [
                f"Move {text} from {a} to {c}.",
                f"Please transfer {text} from my {a} account to {c}.",
                f"Send {text} from {a} to my {c} account.",
            ]
        )
    )
    o = b.call("transfer", from_account=a, to_account=c, amount=amt)
    b.reply(f"Done: moved {text} from {a} to {c}; {a} now has ${o['from_balance']}.")
    plausible(b, rng, a, c)
    return b


@BANK.template("deposit")
def _deposit(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a = rng.choice(sorted(b.env.s["accounts"]))
    amt, text = draw(rng, 50000)
    b.user(rng.choice([f"Deposit {text} into my {a} account.", f"Please add {text} to {a}."]))
    o = b.call("deposit", account=a, amount=amt)
    b.reply(f"Deposited {text}; {a} now has ${o['balance']}.")
    plausible(b, rng, a)
    return b


@BANK.template("freeze")
def _freeze(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a = rng.choice(sorted(b.env.s["accounts"]))
    b.user(rng.choice([f"I lost my card. Please freeze my {a} account.", f"Freeze the {a} account."]))
    b.call("freeze_account", account=a)
    b.reply(f"Your {a} account is now frozen.")
    plausible(b, rng, a)
    return b


@BANK.template("conditional_transfer")
def _conditional_transfer(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    have = bal(b, a)
    threshold = max(100, (have // 100 + rng.choice([-1, 1]) * rng.randint(5, 200)) // 10 * 10)
    amt, text = draw(rng, min(have, threshold * 100))
    b.user(f"If my {a} account has more than ${threshold}, move {text} from {a} to {c}. Otherwise do nothing.")
    o = b.call("get_balance", account=a)
    if have > threshold * 100:
        b.call("transfer", from_account=a, to_account=c, amount=amt)
        b.reply(f"{a} had ${o['balance']}, more than ${threshold}, so I moved {text} to {c}.", expect=[o["balance"]])
    else:
        b.check(f"Does not transfer money ({a} has ${o['balance']})", {"type": "not_called", "tool": "transfer"})
        b.reply(
            f"{a} has only ${o['balance']}, not more than ${threshold}, so I did not move anything.",
            expect=[o["balance"]],
        )
    plausible(b, rng, a)
    return b


@BANK.template("sweep")
def _sweep(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    b.user(rng.choice([f"Move all the money from {a} to {c}.", f"Empty my {a} account into {c}."]))
    o = b.call("get_balance", account=a)
    b.call("transfer", from_account=a, to_account=c, amount=bal(b, a) / 100)
    b.reply(f"Moved ${o['balance']} from {a} to {c}; {a} is now empty.", expect=[o["balance"]])
    plausible(b, rng, a, c)
    return b


@BANK.template("two_transfers")
def _two_transfers(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng, n_accounts=rng.randint(3, 4)), rng)
    a, c, d = rng.sample(sorted(b.env.s["accounts"]), 3)
    x, xt = draw(rng, bal(b, a) // 2)
    y, yt = draw(rng, bal(b, a) // 2)
    b.user(f"Move {xt} from {a} to {c}, and {yt} from {a} to {d}.")
    b.call("transfer", from_account=a, to_account=c, amount=x)
    o = b.call("transfer", from_account=a, to_account=d, amount=y)
    b.reply(f"Both transfers are done; {a} now has ${o['from_balance']}.")
    plausible(b, rng, a)
    return b


@BANK.template("transfer_and_report")
def _transfer_and_report(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    amt, text = draw(rng, bal(b, a))
    b.user(f"Transfer {text} from {a} to {c}, then tell me the new balance of {c}.")
    b.call("transfer", from_account=a, to_account=c, amount=amt)
    o = b.call("get_balance", account=c)
    b.reply(f"Done. {c} now has ${o['balance']}.", expect=[o["balance"]])
    plausible(b, rng, a, c)
    return b


@BANK.template("frozen_transfer")
def _frozen_transfer(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng, frozen=1), rng)
    a = next(n for n, x in b.env.s["accounts"].items() if x["frozen"])
    c = rng.choice(sorted(n for n in b.env.s["accounts"] if n != a))
    amt, text = draw(rng, bal(b, a))
    b.user(f"Send {text} from {a} to {c}.")
    b.call("transfer", fails=True, from_account=a, to_account=c, amount=amt)
    b.reply(f"I could not: the {a} account is frozen, so no money can leave it.", expect=["frozen"])
    b.check("Does not deposit the money instead", {"type": "not_called", "tool": "deposit"})
    plausible(b, rng, a)
    return b


@BANK.template("insufficient_funds")
def _insufficient_funds(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    too_much = (bal(b, a) // 100 + rng.randint(10, 500)) // 10 * 10
    b.user(f"Move ${too_much} from {a} to {c}.")
    b.call("transfer", fails=True, from_account=a, to_account=c, amount=too_much)
    b.reply(f"I could not move ${too_much}: insufficient funds in {a}.", expect=["insufficient"])
    plausible(b, rng, a)
    return b


@BANK.template("check_then_transfer")
def _check_then_transfer(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    b.user(f"What's the balance of my {a} account?")
    o = b.call("get_balance", account=a)
    b.reply(f"Your {a} account has ${o['balance']}.", expect=[o["balance"]])
    amt, text = draw(rng, bal(b, a))
    b.user(rng.choice([f"OK, now move {text} from {a} to {c}.", f"Thanks. Please transfer {text} of it to {c}."]))
    o = b.call("transfer", from_account=a, to_account=c, amount=amt)
    b.reply(f"Moved {text} to {c}; {a} now has ${o['from_balance']}.")
    plausible(b, rng, a, c)
    return b


@BANK.template("deposit_check_freeze")
def _deposit_check_freeze(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    amt, text = draw(rng, 30000)
    b.user(f"Deposit {text} into {a}.")
    b.call("deposit", account=a, amount=amt)
    b.reply(f"Deposited {text} into {a}.")
    b.user(f"What is the balance of {a} now?")
    o = b.call("get_balance", account=a)
    b.reply(f"{a} now has ${o['balance']}.", expect=[o["balance"]])
    b.user(f"Good. Also freeze my {c} account.")
    b.call("freeze_account", account=c)
    b.reply(f"The {c} account is frozen.")
    plausible(b, rng, a, c)
    return b


@BANK.template("compare_then_move")
def _compare_then_move(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, world(rng, n_accounts=4), rng)
    a, c, d = rng.sample(sorted(b.env.s["accounts"]), 3)
    b.user(f"What are the balances of {a} and {c}?")
    oa = b.call("get_balance", account=a)
    oc = b.call("get_balance", account=c)
    b.reply(f"{a} has ${oa['balance']} and {c} has ${oc['balance']}.", expect=[oa["balance"], oc["balance"]])
    amt, text = draw(rng, bal(b, a))
    b.user(f"Move {text} from {a} to {c}.")
    b.call("transfer", from_account=a, to_account=c, amount=amt)
    b.reply(f"Moved {text} from {a} to {c}.")
    dep, dt = draw(rng, 20000)
    b.user(f"Last thing: deposit {dt} into {d} and freeze {a}.")
    b.call("deposit", account=d, amount=dep)
    b.call("freeze_account", account=a)
    b.reply(f"Deposited {dt} into {d} and froze {a}.")
    plausible(b, rng)
    return b


# ----------------------------------------------------------------------------------------------- ood templates
# Held out for the ood split (ood=True): other task structures and phrasings, on worlds of held-out names.


@BANK.template("ood_combined_balance", ood=True)
def _ood_combined_balance(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    b.user(
        rng.choice([f"Together, how much do my {a} and {c} accounts hold?", f"Add up what is in {a} and {c} for me."])
    )
    oa = b.call("get_balance", account=a)
    oc = b.call("get_balance", account=c)
    total = money(bal(b, a) + bal(b, c))
    b.reply(f"{a} has ${oa['balance']} and {c} has ${oc['balance']}: ${total} together.", expect=[total])
    plausible(b, rng, a, c, pool=OOD_NAMES)
    return b


@BANK.template("ood_undo_last_payment", ood=True)
def _ood_undo_last_payment(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng), rng)
    a = rng.choice(sorted({t["account"] for t in b.env.s["transactions"]}))
    b.user(
        rng.choice(
            [
                f"The latest payment on {a} was a mistake. Put that same amount back into {a} as a deposit.",
                f"Refund myself the most recent charge on {a}: deposit exactly that amount into {a}.",
            ]
        )
    )
    o = b.call("get_transactions", account=a, limit=1, check_keys=("account",))
    t = o["transactions"][0]
    c = -cents(float(t["amount"]))
    o2 = b.call("deposit", account=a, amount=c / 100)
    b.reply(
        f"The last payment was {t['memo']} for ${money(c)}; I deposited "
        f"${money(c)} into {a}, which now has ${o2['balance']}.",
        expect=[money(c)],
    )
    plausible(b, rng, a, pool=OOD_NAMES)
    return b


@BANK.template("ood_top_up_from_largest", ood=True)
def _ood_top_up_from_largest(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng, n_accounts=rng.randint(3, 4)), rng)
    c = rng.choice(sorted(b.env.s["accounts"]))
    others = sorted((n for n in b.env.s["accounts"] if n != c), key=lambda n: -bal(b, n))
    if bal(b, others[0]) == bal(b, others[1]):
        raise GenerationError("two largest accounts hold the same amount")
    src = others[0]
    amt, text = draw(rng, bal(b, src))
    b.user(f"Top up {c} with {text} from whichever of my other accounts has the most money.")
    b.call("list_accounts")
    o = b.call("transfer", from_account=src, to_account=c, amount=amt)
    b.reply(
        f"Moved {text} from {src}, your largest other account, to {c}; {c} now has ${o['to_balance']}.", expect=[src]
    )
    plausible(b, rng, c, pool=OOD_NAMES)
    return b


@BANK.template("ood_transfer_with_fallback", ood=True)
def _ood_transfer_with_fallback(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng, n_accounts=rng.randint(3, 4)), rng)
    a, d, c = rng.sample(sorted(b.env.s["accounts"]), 3)
    low, high = bal(b, a) // 100 + 1, bal(b, d) // 100
    if low > high:
        raise GenerationError(f"{d} cannot cover more than {a} holds")
    x = rng.randint(low, min(high, low + 300))
    b.user(f"Pay ${x} from {a} to {c}. If {a} cannot cover it, take it from {d} instead.")
    b.call("transfer", fails=True, from_account=a, to_account=c, amount=x)
    b.call("transfer", from_account=d, to_account=c, amount=x)
    b.reply(f"{a} did not have enough, so I paid ${x} to {c} from {d}.")
    plausible(b, rng, a, pool=OOD_NAMES)
    return b


@BANK.template("ood_two_deposits", ood=True)
def _ood_two_deposits(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng), rng)
    a, c = rng.sample(sorted(b.env.s["accounts"]), 2)
    x, xt = draw(rng, 50000)
    y, yt = draw(rng, 50000)
    b.user(rng.choice([f"Put {xt} into {a} and {yt} into {c}.", f"I have cash: {xt} goes to {a}, {yt} to {c}."]))
    b.call("deposit", account=a, amount=x)
    b.call("deposit", account=c, amount=y)
    b.reply(f"Deposited {xt} into {a} and {yt} into {c}.")
    plausible(b, rng, a, c, pool=OOD_NAMES)
    return b


@BANK.template("ood_history_then_freeze", ood=True)
def _ood_history_then_freeze(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(BankEnv, ood_world(rng), rng)
    counts: dict[str, int] = {}
    for t in b.env.s["transactions"]:
        counts[t["account"]] = counts.get(t["account"], 0) + 1
    busy = sorted(n for n, k in counts.items() if k >= 2)
    if not busy:
        raise GenerationError("no account with two transactions")
    a = rng.choice(busy)
    b.user(f"Which shops were my two latest payments on {a} at?")
    o = b.call("get_transactions", account=a, limit=2)
    memos = [t["memo"] for t in o["transactions"]]
    if len(set(memos)) < 2:
        raise GenerationError("the two latest payments are at the same shop")
    b.reply(f"The two latest {a} payments were at {memos[0]} and {memos[1]}.", expect=memos)
    b.user(f"I never went to {memos[1]}. Freeze {a} right away.")
    b.call("freeze_account", account=a)
    b.reply(f"{a} is frozen now.")
    plausible(b, rng, a, pool=OOD_NAMES)
    return b
