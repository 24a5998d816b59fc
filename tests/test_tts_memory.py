"""The rehearsal memory a small model can use (issue 29): rule-based lessons in Act's own tool format, bounded,
errors listed, never a pasted dialogue; sequential attempts and the final Act see them; records keep them; the
SFT option shows them in training; nothing real or gold reaches a held-out task's memory."""

import json

import pytest

from envace.backends.scripted import ScriptedBackend
from envace.chat.parsing import TOOL_FORMATS
from envace.core.types import Message, Step, ToolCall, Trajectory, dumps, error_obs
from envace.envs import load_tasks, make_env
from envace.evaluation.budget import run_tts
from envace.evaluation.tts import MEMORY_FORMATS, load_records, rehearse, save_records
from envace.rollout.engine import RolloutConfig
from envace.rollout.memory import LESSONS_HEADER, distill, in_tool_format, rehearsal_lessons
from envace.training.sft import gold_trajectories

from test_tts import scripted, tcfg

HERMES = TOOL_FORMATS.get("hermes")
BAL = ToolCall("get_balance", {"account": "rent"})
MOVE = ToolCall("transfer", {"from_account": "rent", "to_account": "garden", "amount": 500})


def traj(steps, k=0):
    return Trajectory(id=f"t/{k}", task_id="t", group_id="g", mode="rehearsal", steps=steps)


def call_step(call, obs, source="rehearse"):
    return Step(user_turn=0, action_text="", calls=[call], observations=[obs], sources=[source])


def reply_step(text="Done."):
    return Step(user_turn=0, action_text=text, reply=text)


def bad_step():
    err = error_obs("bad_format", "tool call is not valid JSON")
    return Step(user_turn=0, action_text="<tool_call>{", parse_error=err, observations=[err], sources=["validation"])


TWO_ATTEMPTS = [
    traj(
        [
            call_step(BAL, {"account": "rent", "balance": "766.57"}),
            call_step(MOVE, error_obs("tool_error", "insufficient funds: rent has 766.57")),
            reply_step(),
        ]
    ),
    traj([bad_step(), reply_step("I cannot help.")], k=1),
]


def test_distill_lists_the_calls_that_worked_and_erred_in_the_tool_format_then_the_reflections():
    notes = distill(TWO_ATTEMPTS, HERMES, reflections=['call get_balance({"account": "rent"}) first', " "])
    assert notes == "\n".join(
        [
            LESSONS_HEADER,
            "Calls that worked, in the order made:",
            '- <tool_call>{"name": "get_balance", "arguments": {"account": "rent"}}</tool_call> returned '
            '{"account": "rent", "balance": "766.57"} (1 of 2 attempts)',
            "Calls to avoid (they returned an error):",
            '- <tool_call>{"name": "transfer", "arguments": {"from_account": "rent", "to_account": "garden", '
            '"amount": 500}}</tool_call> -> tool_error: insufficient funds: rent has 766.57',
            f"- 1 malformed call(s): write a call exactly as {HERMES.call}.",
            "- Attempts 2 called no tool.",
            "Your reflections:",
            '- 1: call <tool_call>{"name": "get_balance", "arguments": {"account": "rent"}}</tool_call> first',
        ]
    )


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_every_quoted_call_is_written_in_the_model_s_tool_format_never_as_a_transcript(fmt):
    tools = TOOL_FORMATS.get(fmt)
    notes = distill(TWO_ATTEMPTS, tools, reflections=['try transfer({"amount": 5}) then reply'])
    for call in (BAL, MOVE, ToolCall("transfer", {"amount": 5})):
        assert tools.render([call]) in notes
        assert call.key() not in notes  # name({json}): what the model copied as a reply
    assert "[assistant]" not in notes and "[tool]" not in notes


def test_distill_is_bounded_and_a_call_that_worked_once_is_not_listed_as_an_error():
    many = [call_step(ToolCall("get_balance", {"account": f"a{i}"}), {"balance": "x" * 900}) for i in range(20)]
    again = [call_step(BAL, error_obs("tool_error", "down")), call_step(BAL, {"balance": "1.00"})]
    notes = distill([traj(many + again)], HERMES, reflections=["r" * 5000] * 3, max_calls=3, value_chars=40)
    lines = notes.splitlines()
    assert sum(line.startswith("- <tool_call>") for line in lines) == 3  # max_calls
    assert all(len(line) < 200 for line in lines if "returned" in line)  # values clipped
    assert all(len(line) <= 200 + 5 for line in lines if line.startswith("- 1: r"))  # text_chars + "- 1: "
    assert "Calls to avoid" not in notes and "(1 of" not in notes  # one attempt: no counts
    assert len(notes) < 1500


def test_distill_refuses_a_real_observation():
    with pytest.raises(ValueError, match="real observation"):
        distill([traj([call_step(BAL, {"balance": "1.00"}, source="real")])], HERMES)


def test_in_tool_format_rewrites_only_decodable_calls():
    assert (
        in_tool_format('do f({"a": 1}) now', HERMES)
        == 'do <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call> now'
    )
    for text in ("f({not json}) x", 'f({"a": 1} x', "f() and g(2)"):
        assert in_tool_format(text, HERMES) == text


def test_memory_formats_registry_keeps_the_old_formats_selectable_and_lessons_is_the_default():
    from envace.config import EvalConfig, RehearseConfig
    from envace.evaluation.experiment import ExperimentConfig
    from envace.evaluation.tts import TTSConfig

    assert set(MEMORY_FORMATS) >= {"lessons", "calls", "agreed", "model", "concat"}
    assert TTSConfig().memory == EvalConfig().tts_memory == RehearseConfig().memory == "lessons"
    assert ExperimentConfig().tts_memory == "lessons"


# --------------------------------------------------------------------------------------------------------
# Behaviour: what sequential attempts and the final Act see (scripted policy)
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def bank():
    make_env(load_tasks("bank", "train", n=1)[0])  # registers the built-in environments
    return load_tasks("bank", "train", n=2)


def _system(tokenizer, row):
    return tokenizer.decode(row.prompt_ids).split("<|im_end|>")[0]


def test_sequential_attempts_and_the_final_act_see_lessons_not_transcripts(tokenizer, bank):
    reflection = 'next time call get_balance({"account": "rent"}) first'
    be = ScriptedBackend(tokenizer, scripted(bank, reflection=reflection))
    recs = run_tts(be, bank, tcfg(n=3, mode="sequential", memory="lessons"))
    for task, rec in zip(bank, recs):
        gold = task.flat_gold()[0]
        assert rec.memory_source == "lessons" and rec.memory.startswith(LESSONS_HEADER)
        for k, attempt in enumerate(rec.attempts):
            system = _system(tokenizer, attempt.rows[0])
            assert ("Notes from private rehearsal" in system) == (k > 0)
            if k:
                assert HERMES.render([gold]) in system and '{"rehearsed": true}' in system
                assert f"({k} of {k} attempts)" in system or k == 1
        final = _system(tokenizer, rec.final.rows[0])
        assert rec.memory in final and HERMES.render([gold]) in rec.memory
        assert HERMES.render([ToolCall("get_balance", {"account": "rent"})]) in rec.memory  # the reflection's call
        for shown in (final, rec.memory):
            assert gold.key() not in shown and "get_balance({" not in shown  # no name({json}) anywhere
            assert "## Attempt" not in shown and "[assistant]" not in shown and "reply from attempt" not in shown
        assert rec.to_dict()["memory_mode"] == "lessons" and rec.config["memory"] == "lessons"


def test_the_older_formats_still_show_transcripts_to_sequential_attempts(tokenizer, bank):
    be = ScriptedBackend(tokenizer, scripted(bank))
    rec = rehearse(be, bank[:1], tcfg(n=2, mode="sequential", memory="concat"))[0]
    system = _system(tokenizer, rec.attempts[1].rows[0])
    assert "## Attempt 1" in system and bank[0].flat_gold()[0].key() in system


def test_the_metrics_count_the_final_run_s_tool_calls(tokenizer, bank):
    """The symptom of issue 29 (the final Act answers without a call) is a metric, not a guess."""
    from envace.evaluation.budget import evaluate_with_tts

    m = evaluate_with_tts(ScriptedBackend(tokenizer, scripted(bank)), bank, tcfg(n=1)).metrics
    assert (
        m["tts/final_tool_calls"] == 1.0 and m["tts/final_no_call_rate"] == 0.0 and m["tts/attempt_tool_calls"] == 1.0
    )


def test_records_without_rows_keep_what_the_model_saw(tokenizer, bank, tmp_path):
    recs = run_tts(ScriptedBackend(tokenizer, scripted(bank)), bank, tcfg(n=2, mode="sequential"))
    path = tmp_path / "deep" / "records.jsonl"
    save_records(str(path), recs, with_rows=False)
    back = load_records(str(path))
    for rec, b in zip(recs, back):
        assert b.memory == rec.memory and b.reflections == rec.reflections and b.success == rec.success
        assert b.memory in b.final.messages[0].content  # the final Act's system prompt, as text
        assert "Notes from private rehearsal" in b.attempts[1].messages[0].content
        assert all(t.rows == [] for t in b.attempts + [b.final]) and b.reflect_rows == [] and b.memory_row is None
    assert len(path.read_text()) < len(json.dumps([r.to_dict() for r in recs]))


def test_a_held_out_task_s_memory_holds_nothing_real_or_gold(tokenizer):
    """The policy makes the gold calls (the worst case), Rehearse imagines: the memory may quote the calls but not
    what the real world returns for them, nor the gold replies."""
    tasks = load_tasks("bank", "test", n=4)
    recs = run_tts(ScriptedBackend(tokenizer, scripted(tasks)), tasks, tcfg(n=2, mode="parallel"))
    for task, rec in zip(tasks, recs):
        env = make_env(task)
        real = [env.call(c) for c in task.flat_gold()]
        for obs in real:
            assert dumps(obs) not in rec.memory
            for v in (obs.get("error", obs) if isinstance(obs, dict) else {}).values():
                if isinstance(v, str) and any(ch.isdigit() for ch in v):  # balances, ids, error messages
                    assert v not in rec.memory, v
        assert not any(r and r in rec.memory for r in task.gold_replies)


# --------------------------------------------------------------------------------------------------------
# Training with notes: SFT rows whose Act prompts carry rehearsal lessons
# --------------------------------------------------------------------------------------------------------


def test_sft_rows_with_notes_carry_the_lessons_in_every_act_prompt_and_keep_the_gold_targets(tokenizer, bank):
    rc = RolloutConfig(max_steps=3)
    notes = rehearsal_lessons(ScriptedBackend(tokenizer, scripted(bank)), bank, rc, n=2, seed=1)
    assert set(notes) == {t.id for t in bank}
    plain = gold_trajectories(tokenizer, bank)
    with_notes = gold_trajectories(tokenizer, bank, memory=notes)
    for task, p, w in zip(bank, plain, with_notes):
        assert notes[task.id].startswith(LESSONS_HEADER) and "(2 of 2 attempts)" in notes[task.id]
        acts = [r for r in w.rows if r.role == "act"]
        assert acts and all(notes[task.id] in tokenizer.decode(r.prompt_ids) for r in acts)
        assert all("Notes from private rehearsal" not in tokenizer.decode(r.prompt_ids) for r in p.rows)
        targets = lambda t: [(r.role, r.completion_ids) for r in t.rows]  # noqa: E731
        assert targets(w) == targets(p)  # the same gold, only the context differs
        # the notes are the scripted policy's imagined world, not the gold's real one
        assert '{"rehearsed": true}' in notes[task.id]
        assert not any(r and r in notes[task.id] for r in task.gold_replies)


def test_training_notes_take_the_memory_format_the_model_will_see_at_test_time(tokenizer, bank):
    tasks = load_tasks("shop-world-decide", "train", n=4)  # each starts with a read
    rc = RolloutConfig(max_steps=3)
    be = ScriptedBackend(tokenizer, scripted(tasks))
    calls = rehearsal_lessons(be, tasks, rc, n=2, seed=1)
    live = rehearsal_lessons(be, tasks, rc, n=2, seed=1, memory="agreed-live")
    for task in tasks:
        first = HERMES.render([task.flat_gold()[0]])
        assert f'{first} returned {{"rehearsed": true}}' in calls[task.id]  # the imagined read result, quoted
        assert f"{first}: a read; make it in the real run" in live[task.id] and "rehearsed" not in live[task.id]
    with pytest.raises(ValueError, match="agreed-live"):
        rehearsal_lessons(be, tasks, rc, n=2, memory="lessons")  # no reflections in training notes
    from envace.config import SFTConfig

    with pytest.raises(ValueError, match="memory_format"):
        SFTConfig(memory_format="model")


def test_sft_memory_attempts_is_off_by_default_and_adds_noted_gold_when_on(tmp_path, monkeypatch):
    import envace.training.sft as sft_mod
    from envace.config import SFTConfig

    assert SFTConfig().memory_attempts == 0
    seen = []
    inner = sft_mod.gold_trajectories
    monkeypatch.setattr(sft_mod, "gold_trajectories", lambda *a, **k: seen.append(k.get("memory")) or inner(*a, **k))
    cfg = dict(model="tiny-random", suite="bank", n_tasks=2, steps=1, batch_tasks=2, progress=False)
    sft_mod.sft(SFTConfig(**cfg, out_dir=str(tmp_path / "off"), tensorboard=False))
    assert seen == [None]
    seen.clear()
    sft_mod.sft(SFTConfig(**cfg, memory_attempts=1, out_dir=str(tmp_path / "on"), tensorboard=False))
    assert seen[0] is None and len(seen[1]) == 2 and all(v.startswith(LESSONS_HEADER) for v in seen[1].values())
    with pytest.raises(ValueError, match="memory_attempts"):
        SFTConfig(memory_attempts=-1)


def test_cli_eval_writes_the_rehearsal_records_it_is_asked_for(tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "records.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "envace.cli", "eval", "--model", "tiny-random", "--suite", "bank", "-n", "1"]
    cmd += ["--tts-n", "1", "--max-steps", "2", "--max-new-tokens", "8", "--tts-records", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    (rec,) = load_records(str(out))
    assert rec.memory_mode == "lessons" and rec.memory.startswith(LESSONS_HEADER) and rec.final is not None
    assert rec.memory in rec.final.messages[0].content and rec.final.rows == []


def test_a_call_whose_rehearsal_was_unreadable_is_not_a_call_to_avoid():
    """Rehearse writing no valid JSON says nothing about the call: on shop-world val the 135M model was told to avoid
    its right first call for that reason, and lost the task (bench/tts_val.py records)."""
    search = ToolCall("search_products", {"query": "candle"})
    unreadable = error_obs("bad_format", "rehearsed observation is not valid JSON (Expecting ',' delimiter)")
    notes = distill([traj([call_step(search, unreadable), reply_step()])], HERMES)
    assert "Calls to avoid" not in notes
    assert notes.splitlines()[1:3] == [
        "Calls whose result the rehearsal did not imagine (check them in the real run):",
        "- " + HERMES.render([search]),
    ]
    worked_later = [call_step(search, unreadable), call_step(search, {"products": []})]
    assert "did not imagine" not in distill([traj(worked_later)], HERMES)  # a readable answer wins
    real_error = [call_step(search, error_obs("bad_format", "tool call is not valid JSON"))]
    assert "Calls to avoid" in distill([traj(real_error)], HERMES)  # Act's own format errors still count


MARKUP_REFLECTIONS = [  # what the 135M model wrote as reflections on shop-world val (bench/tts_val.py records)
    '<tool_call>{"error": {"kind": "bad_format", "message": "tool call is not valid JSON"}}</tool_call>',
    '<tool>{"error": {"kind": "tool_error", "message": "only 1 blue mug is in stock"}}</tool>',
    '[tool] {"error": {"kind": "tool_error", "message": "only 10 coffee beans are in stock"}}',
    '<pre><code><span class="tool_error">only 1 candle in stock</span></code></pre>',
]


@pytest.mark.parametrize("markup", MARKUP_REFLECTIONS)
def test_a_reflection_with_markup_is_dropped_and_prose_ones_are_kept(markup):
    """The final Act copied the markup of such reflections (an error object inside tags, <tool> for <tool_call>)."""
    good = 'search first: search_products({"query": "candle"})'
    notes = distill(TWO_ATTEMPTS, HERMES, reflections=[markup, "check the stock before ordering", good])
    shown = notes.split("Your reflections:")[1]
    assert '"error"' not in shown and "<pre>" not in shown and "<tool>" not in shown
    assert "- 2: check the stock before ordering" in shown  # numbered by attempt: the first was dropped
    assert "- 3: search first: " + HERMES.render([ToolCall("search_products", {"query": "candle"})]) in shown


def test_the_calls_format_shows_the_calls_and_errors_and_no_reflection(tokenizer, bank):
    reflection = "the rent account is empty, give up"
    be = ScriptedBackend(tokenizer, scripted(bank, reflection=reflection))
    recs = run_tts(be, bank, tcfg(n=2, mode="sequential", memory="calls"))
    for task, rec in zip(bank, recs):
        assert rec.memory_source == "calls" and rec.memory.startswith(LESSONS_HEADER)
        assert HERMES.render([task.flat_gold()[0]]) in rec.memory
        assert reflection not in rec.memory and "Your reflections" not in rec.memory
        assert reflection not in _system(tokenizer, rec.attempts[1].rows[0])  # nor in the sequential notes


MUG = ToolCall("place_order", {"customer_id": "C-1", "items": [{"sku": "MUG-BLUE", "qty": 1}]})
LAMP = ToolCall("place_order", {"customer_id": "C-1", "items": [{"sku": "LAMP-1", "qty": 1}]})
LOOKUP = ToolCall("get_customer", {"customer_id": "C-1"})


def test_the_agreed_notes_keep_only_the_calls_every_attempt_made():
    """Two attempts that ordered different products: listing both calls became two real orders (issue 29)."""
    attempts = [
        traj([call_step(LOOKUP, {"name": "Ada"}), call_step(MUG, {"order_id": "O-1"}), reply_step()]),
        traj([call_step(LOOKUP, {"name": "Ada"}), call_step(LAMP, {"order_id": "O-2"}), reply_step()], k=1),
    ]
    notes = distill(attempts, HERMES, agreed=True)
    assert notes == "\n".join(
        [
            LESSONS_HEADER,
            "Calls that worked, in the order made:",
            f'- {HERMES.render([LOOKUP])} returned {{"name": "Ada"}} (2 of 2 attempts)',
            "- 2 call(s) that only some attempts made are left out: the attempts disagreed.",
        ]
    )
    assert HERMES.render([MUG]) in distill(attempts, HERMES)  # the plain lessons list both orders
    one = distill(attempts[:1], HERMES, agreed=True)  # one attempt agrees with itself: every call, nothing left out
    assert one == distill(attempts[:1], HERMES) and HERMES.render([MUG]) in one
    disjoint = [traj([call_step(MUG, {"order_id": "O-1"})]), traj([call_step(LAMP, {"order_id": "O-2"})], k=1)]
    assert "No tool was called" not in distill(disjoint, HERMES, agreed=True)  # calls were made, none agreed


def test_live_reads_are_listed_in_order_without_their_imagined_result_and_writes_keep_theirs():
    """A quoted read's imagined result was taken as done: the final Act cancelled invented order ids without ever
    listing the orders (shop-world-decide val, issue 29)."""
    erred = ToolCall("get_customer", {"customer_id": "C-9"})
    attempts = [
        traj([call_step(LOOKUP, {"name": "Ada"}), call_step(MUG, {"order_id": "O-1"}), reply_step()]),
        traj(
            [
                call_step(LOOKUP, {"name": "Bea"}),
                call_step(MUG, {"order_id": "O-7"}),
                call_step(erred, error_obs("tool_error", "no customer")),
            ],
            k=1,
        ),
    ]
    reads = {"get_customer"}
    notes = distill(attempts, HERMES, read_only=reads, live_reads=True)
    assert notes == "\n".join(
        [
            LESSONS_HEADER,
            "Your rehearsals made these calls, in this order:",
            f"- {HERMES.render([LOOKUP])}: a read; make it in the real run and use its real result (2 of 2 attempts)",
            f'- {HERMES.render([MUG])} returned {{"order_id": "O-1"}} (2 of 2 attempts)',
            f"- {HERMES.render([erred])}: a read; make it in the real run and use its real result (1 of 2 attempts)",
        ]
    )  # no imagined value of a read, and an imagined read error is no call to avoid
    assert "Ada" not in notes and "no customer" not in notes
    agreed = distill(attempts, HERMES, read_only=reads, live_reads=True, agreed=True)
    assert HERMES.render([erred]) not in agreed and "1 call(s) that only some attempts made" in agreed
    assert distill(attempts, HERMES, read_only=reads) == distill(attempts, HERMES)  # only live_reads changes it
    assert distill(attempts, HERMES, live_reads=True).count("returned") == 3  # no tool known read-only


def _cancel_attempt(listed: list[str], k: int = 0, user: str = "Cancel all my pending orders.") -> Trajectory:
    """A rehearsal of 'cancel my pending orders': the imagined list, then a cancel of each imagined id."""
    lst = ToolCall("list_orders", {"status": "pending"})
    steps = [call_step(lst, {"orders": [{"order_id": o, "status": "pending"} for o in listed]})]
    steps += [
        call_step(ToolCall("cancel_order", {"order_id": o}), {"order_id": o, "status": "cancelled"}) for o in listed
    ]
    t = traj(steps + [reply_step()], k=k)
    t.messages = [Message("user", user)]
    return t


def test_real_values_say_a_call_built_on_an_imagined_result_in_words_without_the_invented_value():
    """The final Act copied the write of the memory, order id invented by the rehearsal, after the real read had
    listed another id (shop-world-decide test, issue 29): such a call is said without the value and without markup."""
    reads = {"list_orders"}
    one = [_cancel_attempt(["O-2789"])]
    notes = distill(one, HERMES, read_only=reads, live_reads=True, agreed=True, real_values=True)
    assert notes == "\n".join(
        [
            LESSONS_HEADER,
            "Your rehearsals made these calls, in this order:",
            f"- {HERMES.render([ToolCall('list_orders', {'status': 'pending'})])}: a read; make it in the real run "
            "and use its real result",
            "- cancel_order with its order_id from the real result of list_orders (the rehearsal's values were "
            "imagined)",
        ]
    )
    assert "O-2789" not in notes
    live = distill(one, HERMES, read_only=reads, live_reads=True, agreed=True)
    assert "O-2789" in live  # agreed-live quotes the invented id
    # two attempts that cancelled different invented orders agree on the cancel (not left out as a disagreement)
    two = [_cancel_attempt(["O-2789"]), _cancel_attempt(["O-5"], k=1)]
    both = distill(two, HERMES, read_only=reads, live_reads=True, agreed=True, real_values=True)
    assert "cancel_order with its order_id from the real result of list_orders" in both and "left out" not in both
    assert "left out" in distill(two, HERMES, read_only=reads, live_reads=True, agreed=True)
    # a value the user gave is no imagined value, even when an observation repeats it
    told = [_cancel_attempt(["O-2789"], user="Please cancel order O-2789.")]
    kept = distill(told, HERMES, read_only=reads, live_reads=True, real_values=True)
    assert HERMES.render([ToolCall("cancel_order", {"order_id": "O-2789"})]) in kept
    # a value of an imagined error is never taken as found
    err = traj(
        [
            call_step(BAL, error_obs("tool_error", "no account garden")),
            call_step(ToolCall("get_balance", {"account": "garden"}), {"balance": "5"}),
        ]
    )
    assert HERMES.render([ToolCall("get_balance", {"account": "garden"})]) in distill([err], HERMES, real_values=True)


def test_the_agreed_real_format_is_a_memory_and_a_training_notes_format():
    from envace.training.sft import SFTConfig

    assert "agreed-real" in MEMORY_FORMATS.names()
    assert SFTConfig(memory_attempts=2, memory_format="agreed-real").memory_format == "agreed-real"


def test_the_agreed_live_format_leaves_the_real_run_the_reads_of_a_built_in_task(tokenizer, bank):
    tasks = bank + load_tasks("shop-world-decide", "train", n=4)
    be = ScriptedBackend(tokenizer, scripted(tasks))
    recs = run_tts(be, tasks, tcfg(n=2, mode="parallel", memory="agreed-live"))
    kinds = set()
    for task, rec in zip(tasks, recs):  # the scripted attempts make the first gold call, answered '{"rehearsed": true}'
        assert rec.memory_source == "agreed-live" and rec.memory.startswith(LESSONS_HEADER)
        call = task.flat_gold()[0]
        line = next(x for x in rec.memory.split("\n") if x.startswith(f"- {HERMES.render([call])}"))
        read = task.tool(call.name).read_only
        assert ("a read; make it in the real run" in line) is read and ("rehearsed" in line) is not read
        kinds.add(read)
    assert kinds == {True, False}  # bank tasks start with a write, shop-world-decide ones with a read


def test_the_agreed_format_reaches_the_final_act_without_reflections(tokenizer, bank):
    reflection = "the rent account is empty, give up"
    be = ScriptedBackend(tokenizer, scripted(bank, reflection=reflection))
    recs = run_tts(be, bank, tcfg(n=2, mode="parallel", memory="agreed"))
    for task, rec in zip(bank, recs):  # the scripted attempts make the same gold calls: every one is agreed
        assert rec.memory_source == "agreed" and rec.memory.startswith(LESSONS_HEADER)
        assert HERMES.render([task.flat_gold()[0]]) in rec.memory and "(2 of 2 attempts)" in rec.memory
        assert reflection not in rec.memory and "left out" not in rec.memory
