"""``files``: a small in-memory file system with ls, cat, write_file, mkdir, mv, rm and grep.

State: ``{"dirs": [sorted absolute paths, "/" included], "files": {absolute path: text}}``. Paths must be
absolute; ``grep`` matches a fixed string (case-insensitive), never a regular expression.

Splits: train/test worlds draw directory names from :data:`DIRS` / :data:`SUBDIRS`, file names from
:data:`FILE_NAMES` and text from :data:`LINES` / :data:`NEW_TEXT` with the in-distribution templates; ``ood``
worlds draw them from the ``OOD_*`` pools with the ``ood_*`` templates (read two files, move the file that
mentions a word, append one file to another, save into a missing folder, list a missing folder, delete two,
rename then read).
"""

from __future__ import annotations

import posixpath
import random
from typing import Any

from ..base import ToolError
from .common import Domain, GenerationError, TaskBuilder, ToolEnv, norm_path, persistent_world, tool

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
        names = sorted(
            posixpath.basename(c) + ("/" if self._is_dir(c) else "")
            for c in self._children(p)
            if posixpath.dirname(c) == p
        )
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

    @tool(
        "Move or rename a file or directory. If dst is a directory, move into it.",
        {"src": PATH, "dst": PATH},
        mutates=True,
    )
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
            moved = {p: d + p[len(s) :] for p in [s, *self._children(s)]}
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
        hits = [
            {"path": f, "line": line}
            for f in files
            for line in self.s["files"][f].split("\n")
            if text.lower() in line.lower()
        ]
        return {"matches": hits[:MAX_MATCHES], "truncated": len(hits) > MAX_MATCHES}


# ----------------------------------------------------------------------------------------------- world

DIRS = [
    "docs",
    "notes",
    "work",
    "music",
    "recipes",
    "travel",
    "school",
    "code",
    "archive",
    "photos",
    "games",
    "letters",
]
FILE_NAMES = [
    "todo.txt",
    "ideas.md",
    "plan.txt",
    "shopping.txt",
    "budget.txt",
    "readme.md",
    "log.txt",
    "draft.txt",
    "contacts.txt",
    "recipe.txt",
    "poem.txt",
    "schedule.txt",
    "goals.md",
    "list.txt",
]
LINES = [
    "meeting at 10am",
    "buy milk and eggs",
    "call the dentist",
    "pay rent on friday",
    "flight at 7pm",
    "water the plants",
    "budget is 300 dollars",
    "pick up the kids",
    "book a hotel in rome",
    "return library books",
    "fix the bike",
    "send the report to maria",
    "bake bread on sunday",
    "renew the passport",
    "learn ten new words",
    "clean the garage",
    "buy a gift for leo",
    "train leaves at noon",
    "backup the laptop",
    "plan the picnic",
]
NEW_TEXT = [
    "hello world",
    "remember the keys",
    "lunch with sam",
    "gym at six",
    "order new shoes",
    "read chapter three",
    "visit grandma",
    "walk the dog",
    "check the mail",
    "paint the fence",
]
SUBDIRS = ["old", "2024", "misc"]
# held out: only the ood split's worlds use these
OOD_DIRS = [
    "projects",
    "invoices",
    "sketches",
    "backups",
    "research",
    "lessons",
    "scripts",
    "reports",
    "events",
    "papers",
    "designs",
    "studio",
]
OOD_SUBDIRS = ["2023", "extra", "final"]
OOD_FILE_NAMES = [
    "agenda.txt",
    "summary.md",
    "minutes.txt",
    "wishlist.txt",
    "expenses.txt",
    "journal.md",
    "index.md",
    "errors.log",
    "outline.txt",
    "addresses.txt",
    "menu.txt",
    "song.txt",
    "timetable.txt",
    "checklist.md",
]
OOD_LINES = [
    "dinner with the neighbours",
    "renew the boat license",
    "submit the tax form",
    "buy new batteries",
    "feed the fish at eight",
    "repair the kitchen tap",
    "call grandpa on tuesday",
    "print the concert tickets",
    "pack the tent and stove",
    "return the blender",
    "practice piano daily",
    "order more printer ink",
    "email the landlord",
    "defrost the freezer",
    "wash the curtains",
    "bus leaves at nine",
    "update the antivirus",
    "choose a paint colour",
    "invite priya to lunch",
    "measure the window",
]
OOD_NEW_TEXT = [
    "meet at the station",
    "buy fresh herbs",
    "swim on thursday",
    "charge the camera",
    "write to aunt rosa",
    "fix the doorbell",
    "recycle the boxes",
    "try the new cafe",
    "plant tulips",
    "oil the hinges",
]


def entities(config: dict[str, Any]) -> set[str]:
    """Directory and file names (every part of every path) of an initial state."""
    return {part for p in [*config["dirs"], *config["files"]] for part in p.split("/") if part}


FILES = Domain(
    FilesEnv,
    entities=entities,
    pools={
        "dirs": (DIRS + SUBDIRS, OOD_DIRS + OOD_SUBDIRS),
        "files": (FILE_NAMES, OOD_FILE_NAMES),
        "lines": (LINES, OOD_LINES),
        "new_text": (NEW_TEXT, OOD_NEW_TEXT),
    },
)


def world(rng: random.Random, ood: bool = False) -> dict[str, Any]:
    """2-4 top-level directories (one maybe nested) and 3-6 files of 1-2 distinct short lines; ``ood``: from
    the held-out pools. In a persistent suite the file tree of one customer."""
    if (w := persistent_world(rng, lambda w: True)) is not None:
        return w
    dir_pool, sub_pool, name_pool, line_pool = (
        (OOD_DIRS, OOD_SUBDIRS, OOD_FILE_NAMES, OOD_LINES) if ood else (DIRS, SUBDIRS, FILE_NAMES, LINES)
    )
    tops = ["/" + d for d in rng.sample(dir_pool, rng.randint(2, 4))]
    dirs = ["/", *tops]
    if rng.random() < 0.4:
        dirs.append(rng.choice(tops) + "/" + rng.choice(sub_pool))
    lines = rng.sample(line_pool, 12)
    files: dict[str, str] = {}
    for _ in range(rng.randint(3, 6)):
        d, f = rng.choice(dirs[1:]), rng.choice(name_pool)
        p = d + "/" + f
        if p not in files:
            files[p] = "\n".join(lines.pop() for _ in range(rng.randint(1, 2)))
    return {"dirs": sorted(dirs), "files": dict(sorted(files.items()))}


FILES_WORLD = FILES.persistent(lambda rng, i: world(rng), lambda rng, i: world(rng, ood=True))
"""``files-world``: the file tools and templates on the persistent file trees of a few customers."""


def dirs(b: TaskBuilder) -> list[str]:
    return [d for d in b.env.s["dirs"] if d != "/"]


def files(b: TaskBuilder) -> list[str]:
    return sorted(b.env.s["files"])


def fresh_name(b: TaskBuilder, rng: random.Random, d: str, pool: list[str]) -> str:
    """A path ``d/name`` that does not exist yet."""
    free = [d.rstrip("/") + "/" + n for n in pool if not b.env._exists(d.rstrip("/") + "/" + n)]
    return rng.choice(free)


def plausible(b: TaskBuilder, rng: random.Random, pool: list[str] = FILE_NAMES) -> None:
    """Suggest reference calls: an ls, a cat, sometimes a cat of a missing file (a name from ``pool``)."""
    b.suggest("ls", path=rng.choice(["/", *dirs(b)]))
    b.suggest("cat", path=rng.choice(files(b)))
    if rng.random() < 0.3:
        b.suggest("cat", path=fresh_name(b, rng, rng.choice(dirs(b)), pool))


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
    b.user(
        rng.choice(
            [
                f"Which of my files mentions '{word}'? Search from /.",
                f"Find the file under / that contains the word '{word}'.",
            ]
        )
    )
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


# ----------------------------------------------------------------------------------------------- ood templates
# Held out for the ood split (ood=True): other task structures and phrasings, on worlds of held-out names.


def _lines(b: TaskBuilder, p: str) -> list[str]:
    return b.env.s["files"][p].split("\n")


@FILES.template("ood_read_two", ood=True)
def _ood_read_two(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    p1, p2 = rng.sample(files(b), 2)
    b.user(rng.choice([f"Show me what {p1} and {p2} say.", f"I need the text of both {p1} and {p2}."]))
    b.call("cat", path=p1)
    b.call("cat", path=p2)
    lines = _lines(b, p1) + _lines(b, p2)
    b.reply(f"{p1}: {'; '.join(_lines(b, p1))}. {p2}: {'; '.join(_lines(b, p2))}.", expect=lines)
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_move_mention", ood=True)
def _ood_move_mention(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    d = rng.choice([d for d in dirs(b) if any(f.startswith(d + "/") for f in files(b))])
    word, f = _unique_word(b, rng, d)
    targets = [t for t in dirs(b) if t != posixpath.dirname(f) and not b.env._exists(t + "/" + posixpath.basename(f))]
    if not targets:
        raise GenerationError(f"nowhere to move {f}")
    t = rng.choice(targets)
    b.user(
        rng.choice(
            [
                f"Move the file in {d} that mentions '{word}' into {t}.",
                f"Somewhere in {d} a file talks about '{word}'; put it in {t}.",
            ]
        )
    )
    b.call("grep", text=word, path=d, check_keys=("text",))
    o = b.call("mv", src=f, dst=t, check_keys=("src",))
    b.reply(f"Moved {f} to {o['to']}.")
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_append_file", ood=True)
def _ood_append_file(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    p1, p2 = rng.sample(files(b), 2)
    b.user(
        rng.choice(
            [
                f"Append the text of {p1} to the end of {p2}.",
                f"Add everything in {p1} at the bottom of {p2}, keeping what {p2} has.",
            ]
        )
    )
    o1 = b.call("cat", path=p1)
    o2 = b.call("cat", path=p2)
    b.call("write_file", path=p2, content=o2["content"] + "\n" + o1["content"])
    b.reply(f"Appended {p1} to {p2}.")
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_save_into_missing_folder", ood=True)
def _ood_save_into_missing_folder(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    d = fresh_name(b, rng, "/", OOD_DIRS)
    p = d + "/" + rng.choice(OOD_FILE_NAMES)
    text = rng.choice(OOD_NEW_TEXT)
    b.user(rng.choice([f"Save '{text}' as {p}.", f"Put the line '{text}' in the file {p}."]))
    b.call("write_file", fails=True, path=p, content=text)
    b.call("mkdir", path=d)
    b.call("write_file", path=p, content=text)
    b.reply(f"{d} did not exist, so I created it and saved {p}.")
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_list_missing_folder", ood=True)
def _ood_list_missing_folder(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    d = fresh_name(b, rng, "/", OOD_DIRS)
    b.user(f"What is in {d}? If there is no such folder, list / instead.")
    b.call("ls", fails=True, path=d)
    o = b.call("ls", path="/")
    names = [e.rstrip("/") for e in o["entries"]]
    b.reply(f"There is no {d}; / contains: {', '.join(names)}.", expect=names)
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_delete_two", ood=True)
def _ood_delete_two(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    p1, p2 = rng.sample(files(b), 2)
    b.user(rng.choice([f"Remove {p1} and {p2}.", f"I am done with {p1} and {p2}; delete them."]))
    b.call("rm", path=p1)
    b.call("rm", path=p2)
    b.reply(f"Deleted {p1} and {p2}.")
    plausible(b, rng, OOD_FILE_NAMES)
    return b


@FILES.template("ood_rename_then_read", ood=True)
def _ood_rename_then_read(rng: random.Random) -> TaskBuilder:
    b = TaskBuilder(FilesEnv, world(rng, ood=True), rng)
    src = rng.choice(files(b))
    dst = fresh_name(b, rng, posixpath.dirname(src), OOD_FILE_NAMES)
    b.user(f"Give {src} the new name {dst}.")
    b.call("mv", src=src, dst=dst)
    b.reply(f"{src} is now {dst}.")
    b.user(f"And what does {dst} contain?")
    o = b.call("cat", path=dst)
    lines = o["content"].split("\n")
    b.reply(f"{dst} says: {'; '.join(lines)}.", expect=lines)
    plausible(b, rng, OOD_FILE_NAMES)
    return b
