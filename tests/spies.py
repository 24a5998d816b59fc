"""Real built-in environments that report what happens in them, for tests that check who touches the world."""

from typing import Any, Callable

from envace.core.types import Task, ToolCall
from envace.envs import ENVS, load_tasks, make_env


def spied_bank_tasks(
    name: str, n: int, on_open: Callable[[Task], Any], on_call: Callable[[ToolCall], Any]
) -> list[Task]:
    """``n`` bank train tasks whose environment is the real bank environment, registered as ``name``, that calls
    ``on_open(task)`` when it is built and ``on_call(call)`` before each call it executes."""
    make_env(load_tasks("bank", "train", n=1)[0])  # registers the built-in environments

    def spied(task: Task):
        on_open(task)
        env = ENVS.get("bank")(task)
        inner = env._execute

        def spy(call: ToolCall):
            on_call(call)
            return inner(call)

        env._execute = spy
        return env

    if name not in ENVS:
        ENVS.add(name, spied)
    tasks = load_tasks("bank", "train", n=n)
    for t in tasks:
        t.env = name
    return tasks
