"""bench/tts_reads.py: whether a TTS memory quotes the gold episode's first call with its real result, and whether
the final Act makes that call for real."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from tts_reads import quoted_result, quotes_call, row  # noqa: E402

from envace.core.types import dumps  # noqa: E402
from envace.envs import load_tasks  # noqa: E402
from envace.envs.builtin.shop import ShopEnv  # noqa: E402


def _record(task, result: str, redo: bool) -> dict:
    first = task.flat_gold()[0]
    call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>' % (first.name, dumps(first.arguments))
    memory = f"What your private rehearsals found:\n- {call} returned {result} (2 of 2 attempts)"
    msgs = [{"role": "user", "content": task.user_turns[0]}]
    if redo:
        msgs.append({"role": "assistant", "content": call, "tool_calls": [{"name": first.name, "arguments": {}}]})
    msgs.append({"role": "assistant", "content": "done"})
    return {"task_id": task.id, "memory": memory, "final": {"messages": msgs}, "success": redo}


def test_a_quoted_imagined_list_is_told_from_the_real_one_and_a_skipped_read_is_counted():
    task = next(t for t in load_tasks("shop-world-decide", "val", n=60) if t.metadata["template"] == "cancel_pending")
    env = ShopEnv(task)
    real = dumps(env.call(task.flat_gold()[0]))
    key, r = row(_record(task, real, redo=True))
    assert key.startswith("cancel_pending (") and r == {
        "quoted": True,
        "with_result": True,
        "quoted_real": True,
        "redone": True,
        "success": True,
    }
    _, r = row(_record(task, '{"orders": [{"order_id": "O-1"}]}', redo=False))
    assert r == {"quoted": True, "with_result": True, "quoted_real": False, "redone": False, "success": False}
    live = _record(task, "", redo=False)  # agreed-live: the read listed without a result
    live["memory"] = live["memory"].split(" returned ")[0] + ": a read; make it in the real run (2 of 2 attempts)"
    _, r = row(live)
    assert r == {"quoted": True, "with_result": False, "quoted_real": False, "redone": False, "success": False}


def test_the_quoted_result_drops_the_attempt_count():
    memory = '- <tool_call>{"name": "get_order", "arguments": {}}</tool_call> returned {"a": 1} (1 of 2 attempts)'
    assert quoted_result(memory, "get_order") == '{"a": 1}' and quoted_result(memory, "list_orders") is None
    assert quotes_call(memory, "get_order") and not quotes_call(memory, "list_orders")
