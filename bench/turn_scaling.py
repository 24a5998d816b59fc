"""Turn scaling: the cost of a T-turn rehearsal rollout, T = 1..16, must grow with the tokens each turn adds,
not with the whole history re-encoded every turn.

One rehearsal rollout of ``--turns`` steps (K trajectories of one task, ``schedule: lockstep``) with scripted tokens so
that every step is an Act tool call followed by a Rehearse observation of fixed text (the untrained model would
stop calling tools; scripted tokens cost one batched forward each, like sampled ones). The cost of the first T
turns is the wall time of the generate calls of those turns. Three settings, in one run:

- ``reuse``: ``HFBackend`` as the trainer uses it (per-session KV kept across turns, shared-prefix prefill);
- ``full``: ``keep_sessions=False, share_prefixes=False``: every turn re-encodes the whole history
  (measured up to ``--full-turns``, it is quadratic);
- ``new_only``: the reference, "processing only the new tokens": every generate call of the ``reuse`` run replayed
  with only the tokens that run had to encode (its first prompt whole, then the prompt minus the kept session),
  no history at all, and the same generated tokens.

Reported per T: seconds of each, ``reuse / new_only`` (target <= 1.3: the only extra cost is attending to the
kept history) and ``full / reuse``.

Usage: python bench/turn_scaling.py [--turns 16] [--group 2] [--full-turns 8]
"""

from __future__ import annotations

import argparse

import common  # noqa: F401
from common import HFBackend, forced_backend, write_result

from envace.chat.parsing import render_act
from envace.envs import load_tasks
from envace.backends.models import DEFAULT_MODEL, load
from envace.rollout.engine import RolloutConfig, RolloutEngine


def scripts(task):
    gold = task.flat_gold()

    def act(session, n):
        return render_act([gold[n % len(gold)]])

    def rehearse(session, n):
        return (
            '<observation>{"ok": true, "call": %d, "result": {"status": '
            '"done", "detail": "operation completed"}}</observation>' % n
        )

    return act, rehearse


def per_turn(calls) -> list[dict]:
    """Group generate calls by turn (an Act call starts a turn): seconds, encoded and generated tokens."""
    turns: list[dict] = []
    for c in calls:
        if c["role"] == "act":
            turns.append({"seconds": 0.0, "encoded": 0, "generated": 0, "context": 0})
        t = turns[-1]
        t["seconds"] += c["seconds"]
        t["encoded"] += sum(len(p) - g.cached_tokens for p, g in zip(c["prompts"], c["gens"]))
        t["generated"] += sum(len(g.token_ids) for g in c["gens"])
        t["context"] = max(t["context"], max(len(p) for p in c["prompts"]))
    return turns


def rollout(Forced, model, tok, task, cfg, group, **kw):
    act, reh = scripts(task)
    be = Forced(model, tok, act_script=act, rehearse_script=reh, **kw)
    trajs = RolloutEngine(be, cfg, mode="rehearsal").run([task], group_size=group, seed=0)
    assert all(len(t.steps) == cfg.max_steps for t in trajs), [len(t.steps) for t in trajs]
    return be


def replay_new_only(Forced, model, tok, task, calls, cfg):
    """Every call of the reuse run again, with only the tokens it encoded and no kept history."""
    act, reh = scripts(task)
    be = Forced(model, tok, act_script=act, rehearse_script=reh, keep_sessions=False, share_prefixes=True)
    seen: set[str] = set()
    for c in calls:
        prompts = []
        for p, g, s in zip(c["prompts"], c["gens"], c["sessions"]):
            prompts.append(p if s not in seen else p[g.cached_tokens :])
            seen.add(s)
        params = cfg.act if c["role"] == "act" else cfg.rehearse
        gens = be.generate(prompts, params.with_(seed=0), c["sessions"])
        assert [len(g.token_ids) for g in gens] == [len(g.token_ids) for g in c["gens"]]
    return be


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--group", type=int, default=2, help="K trajectories of the task, in lockstep")
    ap.add_argument(
        "--full-turns", type=int, default=8, help="turns of the full re-encoding run (it grows quadratically)"
    )
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    model, tok = load(args.model)
    task = load_tasks("builtin", "train", n=1, seed=0)[0]
    Forced = forced_backend(HFBackend)
    HFBackend(model, tok).generate(
        [tok.encode("Hello")], RolloutConfig().act.with_(max_new_tokens=4, seed=0)
    )  # warm-up

    def cfg(turns):
        # lockstep: every turn's calls are separate generate calls, timed one by one (the KV reuse is the same
        # as under continuous batching, where a turn has no wall-clock boundary of its own)
        return RolloutConfig(max_steps=turns, max_steps_per_turn=turns, max_context_tokens=8192, schedule="lockstep")

    reuse = rollout(Forced, model, tok, task, cfg(args.turns), args.group)
    new_only = replay_new_only(Forced, model, tok, task, reuse.calls, cfg(args.turns))
    full = rollout(
        Forced,
        model,
        tok,
        task,
        cfg(min(args.full_turns, args.turns)),
        args.group,
        keep_sessions=False,
        share_prefixes=False,
    )
    tr, tn, tf = per_turn(reuse.calls), per_turn(new_only.calls), per_turn(full.calls)
    rows = []
    cum = {"reuse": 0.0, "new_only": 0.0, "full": 0.0}
    for T in range(1, args.turns + 1):
        cum["reuse"] += tr[T - 1]["seconds"]
        cum["new_only"] += tn[T - 1]["seconds"]
        row = {
            "T": T,
            "context_tokens": tr[T - 1]["context"],
            "reuse_s": cum["reuse"],
            "new_only_s": cum["new_only"],
            "reuse_over_new_only": cum["reuse"] / cum["new_only"],
            "turn_encoded_tokens_reuse": tr[T - 1]["encoded"],
            "turn_generated_tokens": tr[T - 1]["generated"],
        }
        if T <= len(tf):
            cum["full"] += tf[T - 1]["seconds"]
            row |= {
                "full_s": cum["full"],
                "full_over_reuse": cum["full"] / cum["reuse"],
                "turn_encoded_tokens_full": tf[T - 1]["encoded"],
            }
        rows.append(row)
        print(
            f"T={T:2d} ctx={row['context_tokens']:5d}  reuse {row['reuse_s']:7.1f}s  "
            f"new-only {row['new_only_s']:7.1f}s  ratio {row['reuse_over_new_only']:.2f}"
            + (f"  full {row['full_s']:7.1f}s ({row['full_over_reuse']:.2f}x reuse)" if "full_s" in row else "")
        )
    last = rows[-1]
    res = {
        "model": args.model,
        "task": task.id,
        "K": args.group,
        "turns": rows,
        "stats": {"reuse": reuse.stats, "new_only": new_only.stats, "full": full.stats},
        "targets": {f"reuse <= 1.3x new-only at T={last['T']}": last["reuse_over_new_only"] <= 1.3},
    }
    print("targets:", res["targets"])
    write_result("turn_scaling", res, args.out)


if __name__ == "__main__":
    main()
