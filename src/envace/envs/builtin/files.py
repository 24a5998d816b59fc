"""``files``: a small in-memory file system with ls, cat, write_file, mkdir, mv, rm and grep.

State: ``{"dirs": [sorted absolute paths, "/" included], "files": {absolute path: text}}``. Paths must be
absolute; ``grep`` matches a fixed string (case-insensitive), never a regular expression.
"""
from __future__ import annotations

import posixpath
import random
from typing import Any

from ..base import ToolError
from .common import Domain, GenerationError, TaskBuilder, ToolEnv, norm_path, tool

PATH = {"type": "string", "description": "absolute path"}
MAX_MATCHES = 20


class FilesEnv(ToolEnv):
    domain = "files"
    system_prompt = (
        "You are a file assistant. Use the tools to read and change the user's files. Paths are absolute, "
        "like /docs/todo.txt. Do only what the user asks, then answer in one short sentence."
    )

    # -- helpers
    def _is_dir(self, p: str) -> bool:
        return p in self.s["dirs"]

    def _exists(self, p: str) -> bool:
        return p in self.s["files"] or self._is_dir(p)

    def _missing(self, p: str) -> ToolError:
        return ToolError(f"no such file or directory: {p}")

    def _parent_ok(self, p: str) -> None:
        parent = posixpath.dirname(p)
        if not self._is_dir(parent):
            raise ToolError(f"parent directory does not exist: {parent}")

    def _children(self, d: str) -> list[str]:
        prefix = d.rstrip("/") + "/"
        return [p for p in [*self.s["dirs"], *self.s["files"]] if p != d and p.startswith(prefix)]

    # -- tools
    @tool("List a directory.", {"path": PATH})
    def ls(self, path: str) -> dict[str, Any]:
        p = norm_path(path)
        if p in self.s["files"]:
            raise ToolError(f"not a directory: {p}")
        if not self._is_dir(p):
            raise self._missing(p)
        names = sorted(posixpath.basename(c) + ("/" if self._is_dir(c) else "") for c in self._children(p) if posixpath.dirname(c) == p)
        return {"path": p, "entries": names}

    @tool("Read a file.", {"path": PATH})
    def cat(self, path: str) -> dict[str, Any]:
        p = norm_path(path)
        if self._is_dir(p):
            raise ToolError(f"is a directory: {p}")
        if p not in self.s["files"]:
            raise self._missing(p)
        return {"path": p, "content": self.s["files"][p]}

    @tool("Create or overwrite a file.", {"path": PATH, "content": {"type": "string"}}, mutates=True)
    def write_file(self, path: str, content: str) -> dict[str, Any]:
        p = norm_path(path)
        if self._is_dir(p):
            raise ToolError(f"is a directory: {p}")
        self._parent_ok(p)
        self.s["files"][p] = content
        return {"path": p, "chars": len(content)}

    @tool("Create a directory.", {"path": PATH}, mutates=True)
    def mkdir(self, path: str) -> dict[str, Any]:
        p = norm_path(path)
        if self._exists(p):
            raise ToolError(f"already exists: {p}")
        self._parent_ok(p)
        self.s["dirs"] = sorted([*self.s["dirs"], p])
        return {"path": p, "created": True}

    @tool("Move or rename a file or directory. If dst is a directory, move into it.", {"src": PATH, "dst": PATH}, mutates=True)
    def mv(self, src: str, dst: str) -> dict[str, Any]:
        s, d = norm_path(src), norm_path(dst)
        if not self._exists(s):
            raise self._missing(s)
        if s == "/":
            raise ToolError("cannot move /")
        if self._is_dir(d):
            d = posixpath.join(d, posixpath.basename(s))
        if self._exists(d):
            raise ToolError(f"already exists: {d}")
        self._parent_ok(d)
        if self._is_dir(s):
            if d.startswith(s + "/"):
                raise ToolError(f"cannot move {s} into itself")
            moved = {p: d + p[len(s):] for p in [s, *self._children(s)]}
            self.s["dirs"] = sorted(moved.get(p, p) for p in self.s["dirs"])
            self.s["files"] = {moved.get(p, p): t for p, t in self.s["files"].items()}
        else:
            self.s["files"][d] = self.s["files"].pop(s)
        self.s["files"] = dict(sorted(self.s["files"].items()))
        return {"from": s, "to": d}

    @tool("Delete a file or an empty directory.", {"path": PATH}, mutates=True)
    def rm(self, path: str) -> dict[str, Any]:
        p = norm_path(path)
        if p == "/":
            raise ToolError("cannot remove /")
        if p in self.s["files"]:
            del self.s["files"][p]
        elif self._is_dir(p):
            if self._children(p):
                raise ToolError(f"directory not empty: {p}")
            self.s["dirs"].remove(p)
        else:
            raise self._missing(p)
        return {"removed": p}

    @tool("Find lines containing a text in the files under a path.", {"text": {"type": "string"}, "path": PATH})
    def grep(self, text: str, path: str) -> dict[str, Any]:
        p = norm_path(path)
        if not self._exists(p):
            raise self._missing(p)
        if not text:
            raise ToolError("text must not be empty")
        files = [p] if p in self.s["files"] else sorted(c for c in self._children(p) if c in self.s["files"])
        hits = [{"path": f, "line": line} for f in files for line in self.s["files"][f].split("\n") if text.lower() in line.lower()]
        return {"matches": hits[:MAX_MATCHES], "truncated": len(hits) > MAX_MATCHES}


FILES = Domain(FilesEnv)

# ----------------------------------------------------------------------------------------------- world

DIRS = ["docs", "notes", "work", "music", "recipes", "travel", "school", "code", "archive", "photos", "games", "letters"]
FILE_NAMES = ["todo.txt", "ideas.md", "plan.txt", "shopping.txt", "budget.txt", "readme.md", "log.txt", "draft.txt",
              "contacts.txt", "recipe.txt", "poem.txt", "schedule.txt", "goals.md", "list.txt"]
LINES = ["meeting at 10am", "buy milk and eggs", "call the dentist", "pay rent on friday", "flight at 7pm",
         "water the plants", "budget is 300 dollars", "pick up the kids", "book a hotel in rome", "return library books",
         "fix the bike", "send the report to maria", "bake bread on sunday", "renew the passport", "learn ten new words",
         "clean the garage", "buy a gift for leo", "train leaves at noon", "backup the laptop", "plan the picnic"]
NEW_TEXT = ["hello world", "remember the keys", "lunch with sam", "gym at six", "order new shoes", "read chapter three",
            "visit grandma", "walk the dog", "check the mail", "paint the fence"]


def world(rng: random.Random) -> dict[str, Any]:
    """2-4 top-level directories (one maybe nested) and 3-6 files of 1-2 distinct short lines."""
    tops = ["/" + d for d in rng.sample(DIRS, rng.randint(2, 4))]
    dirs = ["/", *tops]
    if rng.random() < 0.4:
        dirs.append(rng.choice(tops) + "/" + rng.choice(["old", "2024", "misc"]))
    lines = rng.sample(LINES, 12)
    files: dict[str, str] = {}
    for _ in range(rng.randint(3, 6)):
        d, f = rng.choice(dirs[1:]), rng.choice(FILE_NAMES)
        p = d + "/" + f
        if p not in files:
            files[p] = "\n".join(lines.pop() for _ in range(rng.randint(1, 2)))
    return {"dirs": sorted(dirs), "files": dict(sorted(files.items()))}


def dirs(b: TaskBuilder) -> list[str]:
    return [d for d in b.env.s["dirs"] if d != "/"]


def files(b: TaskBuilder) -> list[str]:
    return sorted(b.env.s["files"])


def fresh_name(b: TaskBuilder, rng: random.Random, d: str, pool: list[str]) -> str:
    """A path ``d/name`` that does not exist yet."""
    free = [d.rstrip("/") + "/" + n for n in pool if not b.env._exists(d.rstrip("/") + "/" + n)]
    return rng.choice(free)


def plausible(b: TaskBuilder, rng: random.Random) -> None:
    """Suggest reference calls: an ls, a cat, sometimes a cat of a missing file."""
    b.suggest("ls", path=rng.choice(["/", *dirs(b)]))
    b.suggest("cat", path=rng.choice(files(b)))
    if rng.random() < 0.3:
        b.suggest("cat", path=fresh_name(b, rng, rng.choice(dirs(b)), FILE_NAMES))


# ----------------------------------------------------------------------------------------------- templates


@FILES.template("read_question")
def _read_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = rng.choice(files(b))
    b.user(rng.choice([f"What does {p} say?", f"Read {p} for me."]))
    o = b.call("cat", path=p)
    lines = o["content"].split("\n")
    b.reply(f"{p} says: {'; '.join(lines)}.", expect=lines)
    plausible(b, rng)
    return b


@FILES.template("list_question")
def _list_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    d = rng.choice([d for d in dirs(b) if b.env._children(d)])
    b.user(rng.choice([f"What is in the folder {d}?", f"List the files in {d}."]))
    o = b.call("ls", path=d)
    names = [e.rstrip("/") for e in o["entries"]]
    b.reply(f"{d} contains: {', '.join(names)}.", expect=names)
    plausible(b, rng)
    return b


def _unique_word(b: TaskBuilder, rng: random.Random, under: str) -> tuple[str, str]:
    """A word that occurs in exactly one file under ``under``: (word, that file)."""
    fs = [f for f in files(b) if f.startswith(under.rstrip("/") + "/")]
    options = []
    for f in fs:
        for w in set(b.env.s["files"][f].replace("\n", " ").split()):
            if len(w) >= 4 and sum(w in b.env.s["files"][g].lower() for g in fs) == 1:
                options.append((w, f))
    if not options:
        raise GenerationError(f"no unique word under {under}")
    return rng.choice(sorted(options))


@FILES.template("grep_question")
def _grep_question(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    word, f = _unique_word(b, rng, "/")
    b.user(rng.choice([f"Which of my files mentions '{word}'? Search from /.", f"Find the file under / that contains the word '{word}'."]))
    b.call("grep", text=word, path="/", check_keys=("text",))
    b.reply(f"The word '{word}' is in {f}.", expect=[f])
    plausible(b, rng)
    return b


@FILES.template("write")
def _write(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = fresh_name(b, rng, rng.choice(dirs(b)), FILE_NAMES)
    text = rng.choice(NEW_TEXT)
    b.user(rng.choice([f"Create a file {p} with the text '{text}'.", f"Write '{text}' into a new file {p}."]))
    b.call("write_file", path=p, content=text)
    b.reply(f"Created {p}.")
    plausible(b, rng)
    return b


@FILES.template("mkdir")
def _mkdir(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = fresh_name(b, rng, rng.choice(["/", *dirs(b)]), DIRS)
    b.user(rng.choice([f"Make a new folder {p}.", f"Create the directory {p}."]))
    b.call("mkdir", path=p)
    b.reply(f"Created the folder {p}.")
    plausible(b, rng)
    return b


@FILES.template("rename")
def _rename(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    src = rng.choice(files(b))
    dst = fresh_name(b, rng, posixpath.dirname(src), FILE_NAMES)
    b.user(rng.choice([f"Rename {src} to {dst}.", f"Please move {src} to {dst}."]))
    b.call("mv", src=src, dst=dst)
    b.reply(f"Renamed {src} to {dst}.")
    plausible(b, rng)
    return b


@FILES.template("delete")
def _delete(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = rng.choice(files(b))
    b.user(rng.choice([f"Delete {p}.", f"Please remove the file {p}."]))
    b.call("rm", path=p)
    b.reply(f"Deleted {p}.")
    plausible(b, rng)
    return b


@FILES.template("mkdir_and_move")
def _mkdir_and_move(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    f = rng.choice(files(b))
    d = fresh_name(b, rng, "/", DIRS)
    b.user(f"Make a folder {d} and move {f} into it.")
    b.call("mkdir", path=d)
    o = b.call("mv", src=f, dst=d + "/" + posixpath.basename(f), check_keys=("src",))
    b.reply(f"Created {d} and moved the file to {o['to']}.")
    plausible(b, rng)
    return b


@FILES.template("copy")
def _copy(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    src = rng.choice(files(b))
    dst = fresh_name(b, rng, rng.choice(dirs(b)), FILE_NAMES)
    b.user(f"Copy {src} to a new file {dst}.")
    o = b.call("cat", path=src)
    b.call("write_file", path=dst, content=o["content"])
    b.reply(f"Copied {src} to {dst}.")
    plausible(b, rng)
    return b


@FILES.template("grep_and_delete")
def _grep_and_delete(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    d = rng.choice([d for d in dirs(b) if any(f.startswith(d + "/") for f in files(b))])
    word, f = _unique_word(b, rng, d)
    b.user(f"Find the file in {d} that mentions '{word}' and delete it.")
    b.call("grep", text=word, path=d, check_keys=("text",))
    b.call("rm", path=f)
    b.reply(f"Deleted {f}, which mentioned '{word}'.", expect=[posixpath.basename(f)])
    plausible(b, rng)
    return b


@FILES.template("rmdir_if_empty")
def _rmdir_if_empty(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    full = [d for d in dirs(b) if b.env._children(d)]
    d = rng.choice(full)
    b.user(f"Delete the folder {d}, but only if it is empty.")
    b.call("rm", fails=True, path=d)
    b.reply(f"I did not delete {d}: the directory is not empty.", expect=["not empty"])
    plausible(b, rng)
    return b


@FILES.template("read_or_create")
def _read_or_create(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = fresh_name(b, rng, rng.choice(dirs(b)), FILE_NAMES)
    text = rng.choice(NEW_TEXT)
    b.user(f"Read {p}. If it does not exist, create it with the text '{text}'.")
    b.call("cat", fails=True, path=p)
    b.call("write_file", path=p, content=text)
    b.reply(f"{p} did not exist, so I created it with '{text}'.")
    plausible(b, rng)
    return b


@FILES.template("list_then_delete")
def _list_then_delete(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    d = rng.choice([d for d in dirs(b) if any(posixpath.dirname(f) == d for f in files(b))])
    b.user(f"What is in {d}?")
    o = b.call("ls", path=d)
    names = [e.rstrip("/") for e in o["entries"]]
    b.reply(f"{d} contains: {', '.join(names)}.", expect=names)
    f = rng.choice([f for f in files(b) if posixpath.dirname(f) == d])
    b.user(f"Delete {f}.")
    b.call("rm", path=f)
    b.reply(f"Deleted {f}.")
    plausible(b, rng)
    return b


@FILES.template("read_then_append")
def _read_then_append(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    p = rng.choice(files(b))
    b.user(f"What does {p} say?")
    o = b.call("cat", path=p)
    lines = o["content"].split("\n")
    b.reply(f"{p} says: {'; '.join(lines)}.", expect=lines)
    text = rng.choice(NEW_TEXT)
    b.user(f"Add a new last line '{text}' to it, keeping the old text.")
    b.call("write_file", path=p, content=o["content"] + "\n" + text)
    b.reply(f"Added '{text}' to {p}.")
    plausible(b, rng)
    return b


@FILES.template("new_project")
def _new_project(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng), rng)
    d = fresh_name(b, rng, "/", DIRS)
    text = rng.choice(NEW_TEXT)
    b.user(f"Create a folder {d}.")
    b.call("mkdir", path=d)
    b.reply(f"Created {d}.")
    fname = rng.choice(FILE_NAMES)
    b.user(f"Write '{text}' into {d}/{fname}.")
    b.call("write_file", path=f"{d}/{fname}", content=text)
    b.reply(f"Wrote {d}/{fname}.")
    src = rng.choice([f for f in files(b) if not f.startswith(d + "/")])
    b.user(f"Move {src} into {d} too, then list {d}.")
    b.call("mv", src=src, dst=d + "/" + posixpath.basename(src), check_keys=("src",))
    o = b.call("ls", path=d)
    names = [e.rstrip("/") for e in o["entries"]]
    b.reply(f"{d} now contains: {', '.join(names)}.", expect=names)
    plausible(b, rng)
    return b
