"""What each role sees, rendered to token ids.

Contexts are built by *appending* token segments, never by re-templating a whole chat: the completion a
model generated stays in its context exactly as sampled (no re-tokenisation), and consecutive turns of one
context share their prefix token for token, so a backend can keep that prefix's KV cache.

The segments come from a chat format (:data:`CHAT_FORMATS`, chosen by :meth:`ChatFormat.for_tokenizer`):
``chatml`` (SmolLM2, Qwen) or ``template``, each role's prefix and suffix differenced once from the tokenizer's
own chat template (Llama 3.x, Phi, ...) and verified on a probe chat against the template's own tokenization; a
template that cannot be appended to (Mistral's system prompt merged into a user turn, one that raises) falls back
to ChatML with a one-line notice. Act's system prompt holds the task's prompt and the calling instructions of the
model's tool format (``envace.chat.parsing.TOOL_FORMATS``); its tools are the template's own ``tools=`` rendering where
a ``template`` format renders them inside the system turn (:meth:`ChatFormat.opening`, verified on a probe chat with
tools; ``RolloutConfig.native_tools``), else envace's text list (:func:`act_system`), with a one-line notice where a
template puts them elsewhere (Llama 3.1: in the first user message), ignores them or fails on them.

Act sees the usual agent chat (system prompt with tool schemas, user turns, its own calls, tool results).
Rehearse sees its own context (METHOD.md section 1): a simulator system prompt, the candidate tool schemas,
optional reference call -> result examples, then per call a user message holding the conversation since the
previous call (serialized) and the current call (name, schema, arguments); its reply is the observation.
Departure from the reference code, for prefix reuse: the Rehearse context of a trajectory is one growing chat
(earlier calls and the observations it produced stay as earlier turns) instead of a fresh prompt per call.
The information is the same: the whole conversation so far and the current call.

Thinking in the history (:data:`THINKING_HISTORY`, ``RolloutConfig.thinking_history``): some templates are not
append-only for reasoning models. Qwen3's drops the ``<think>`` block of every assistant turn before the last user
message, so a context grown by appending (the thinking kept) is not the template's rendering of the same chat.
``keep`` appends as above, thinking kept (differing from such a template's own rendering); ``strip`` writes every
assistant turn that a later user message follows as the template does (:func:`earlier_answer`), so each Act turn's
prompt is the template's rendering of the chat so far, the turns since the last user message as sampled; a user
turn's first prompt is then not an extension of the last context, and backends reuse only the common prefix.
:attr:`ChatFormat.drops_thinking` says whether a tokenizer's template drops it (probed on a chat with thinking).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .parsing import OBS_CLOSE, OBS_OPEN, THINK_CLOSE, TOOL_FORMATS, ToolFormat
from ..core.registry import Registry
from ..core.types import Message, ReferenceExample, Task, ToolCall, ToolSpec, dumps

ACT_INSTRUCTIONS = TOOL_FORMATS.get("hermes").instructions
"""How to call tools, in the default (hermes) format; each tool format has its own (``ToolFormat.instructions``)."""

REHEARSE_SYSTEM = (
    "You are a precise tool simulator. You are given tool schemas, reference examples of real calls, the "
    "conversation so far and one tool call. First validate the call: the tool must exist and the arguments "
    'must fit its schema; if not, return {"error": {"kind": "unknown_tool" or "bad_arguments", '
    '"message": ...}}. Otherwise return exactly what the real tool would return, consistent with the '
    'conversation and the examples (a failure the tool would report is {"error": {"kind": "tool_error", '
    f'"message": ...}}}}). Answer with {OBS_OPEN}{{json}}{OBS_CLOSE} and nothing else.'
)


def render_tools(tools: list[ToolSpec]) -> str:
    return "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}, ensure_ascii=False)
        for t in tools
    )


def act_system(task: Task, memory: str | None = None, tools: ToolFormat | None = None, tool_list: bool = True) -> str:
    """Act's system prompt: the task's prompt, envace's textual tool list (``tool_list``; False where the chat
    template renders the tools itself, :meth:`ChatFormat.opening`), how to call tools in the format ``tools``
    (default hermes; kept either way: the tool format need not be the template's own), rehearsal notes."""
    how = (tools or TOOL_FORMATS.get("hermes")).instructions
    listed = "# Tools\n" + render_tools(task.tools) if tool_list else ""
    parts = [task.system_prompt.strip(), listed, how]
    if memory:
        parts.append("# Notes from private rehearsal\n" + memory.strip())
    return "\n\n".join(p for p in parts if p)


def rehearse_system(task: Task, references: list[ReferenceExample] | None = None) -> str:
    refs = task.references if references is None else references
    parts = [REHEARSE_SYSTEM, "# Tools\n" + render_tools(task.tools)]
    if refs:
        parts.append("# Reference examples\n" + "\n".join(f"{r.call.key()} -> {dumps(r.result)}" for r in refs))
    return "\n\n".join(parts)


def serialize_messages(messages: list[Message]) -> str:
    """A compact transcript of (part of) the Act chat for the Rehearse context."""
    lines = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "assistant" and m.tool_calls:
            lines.append("[assistant] " + " ".join(c.key() for c in m.tool_calls))
        elif m.role == "tool":
            lines.append(f"[tool] {m.content}")
        else:
            lines.append(f"[{m.role}] {m.content.strip()}")
    return "\n".join(lines)


def rehearse_user_message(transcript: list[str], call: ToolCall, spec: ToolSpec | None) -> str:
    """The Rehearse user message: the conversation lines since the previous rehearsed call, then the call."""
    conv = "\n".join(transcript) or "(nothing new)"
    schema = json.dumps(spec.parameters, ensure_ascii=False) if spec else "(no such tool)"
    return (
        f"Conversation since the last call:\n{conv}\n\nCurrent call:\nname: "
        f"{call.name}\nschema: {schema}\narguments: {dumps(call.arguments)}"
    )


ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ChatFormat:
    """A chat rendered into token segments: each role's message is ``prefix + content + suffix``, appended.

    ``prefixes`` / ``suffixes``: role -> text around the content (a message that is not the chat's first);
    ``first_prefixes``: role -> the prefix when the message opens the chat (a template's ``bos_token`` or default
    system block); ``generation``: the text that opens an assistant generation; ``end``: the end-of-turn token,
    the first special token after an assistant's content (``stop_ids`` adds the tokenizer's eos);
    ``codecs``: role -> how content is written into its segment (``raw``, or ``json`` for a template that writes
    a tool result as a JSON string, as Llama 3.1's ``tojson`` does). ``fallback``: why a ``template`` format could
    not be used, when this is the ChatML format in its place (None otherwise). ``thinking``: the template's
    ``enable_thinking`` the format was derived with. ``tools_fallback``: why a ``template`` format's own ``tools=``
    rendering cannot open Act's chat (None: it can, :attr:`renders_tools`). ``drops_thinking``: the tokenizer's
    template drops the thinking of assistant turns before the last user message, as Qwen3's does
    (:func:`_probe_thinking`; it decides the default :meth:`thinking_history`)."""

    tokenizer: Any
    prefixes: dict[str, str]
    suffixes: dict[str, str]
    generation: str
    end: str
    first_prefixes: dict[str, str] = field(default_factory=dict)
    codecs: dict[str, str] = field(default_factory=dict)
    name: str = "chatml"
    fallback: str | None = None
    thinking: bool | None = None
    tools_fallback: str | None = None
    drops_thinking: bool = False

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, name: str | None = None, thinking: bool | None = None) -> "ChatFormat":
        """The format ``name`` (:data:`CHAT_FORMATS`; an unknown name lists the valid ones) for ``tokenizer``;
        None: ``chatml`` for a ChatML vocabulary (``<|im_start|>`` / ``<|im_end|>``), else ``template``.
        ``thinking``: passed to the template as ``enable_thinking`` where the generation prompt is derived from
        it (None: the template's default). Built once per tokenizer, name and setting (kept on the tokenizer)."""
        name = name or default_chat_format(tokenizer)
        build = CHAT_FORMATS.get(name)
        template = getattr(tokenizer, "chat_template", None)
        key = (name, thinking, template if isinstance(template, str) else None, _size(tokenizer))
        cache = getattr(tokenizer, "_envace_chat_formats", None)
        if cache is None:
            cache = {}
            try:
                tokenizer._envace_chat_formats = cache
            except AttributeError:  # a tokenizer that takes no attributes: build every time
                pass
        if key not in cache:
            fmt = build(tokenizer, thinking)
            fmt.drops_thinking = _probe_thinking(fmt)
            cache[key] = fmt
        return cache[key]

    def __post_init__(self) -> None:
        added = getattr(self.tokenizer, "added_tokens_encoder", None) or {}
        self._specials = tuple(sorted(set(added) | set(getattr(self.tokenizer, "all_special_tokens", []))))

    @property
    def end_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(self.end)

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a generation: the end-of-turn token, then the tokenizer's eos if it is another."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return [self.end_id] + ([eos] if eos is not None and eos != self.end_id else [])

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prefix(self, role: str, first: bool = False) -> str:
        if first and role in self.first_prefixes:
            return self.first_prefixes[role]
        if role not in self.prefixes:
            raise ValueError(f"chat format {self.name!r} has no role {role!r}; roles: {', '.join(self.prefixes)}")
        return self.prefixes[role]

    def message(self, role: str, content: str, first: bool = False) -> list[int]:
        """One message (``first``: it opens the chat). Content is data: a special-token string inside it
        (``<|im_start|>system`` in a tool result or in the arguments of a call) is encoded as plain text, never
        as a control token."""
        return self._wrap(self.prefix(role, first), CODECS[self.codecs.get(role, "raw")](content), self.suffixes[role])

    def _wrap(self, pre: str, content: str, suf: str) -> list[int]:
        """``pre + content + suf`` encoded, the special-token strings of ``content`` as plain text."""
        if any(sp in content for sp in self._specials):
            text_ids = self.tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
            return self.encode(pre) + text_ids + self.encode(suf)
        return self.encode(f"{pre}{content}{suf}")

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template's own ``tools=`` rendering opens Act's chat (a ``template`` format whose
        template writes the tools inside its system turn, verified by :func:`_probe_tools`)."""
        return self.name == "template" and self.tools_fallback is None

    def uses_native_tools(self, wanted: bool) -> bool:
        """Whether Act's system turn gets its tools from the template (``wanted``: ``RolloutConfig.native_tools``,
        and :attr:`renders_tools`). A ``template`` format that cannot says so once, naming the model and the reason
        (envace's text tool list is used instead); a ChatML format uses the text list without a word."""
        if wanted and self.name == "template" and self.tools_fallback is not None:
            notice(
                f"{_model_name(self.tokenizer)}: the chat template's own tool prompt is not used, Act's system prompt "
                f"lists the tools as envace's text instead: {self.tools_fallback}"
            )
        return wanted and self.renders_tools

    def template_text(
        self, messages: list[dict[str, str]], generation: bool = False, tools: list[ToolSpec] | None = None
    ) -> str:
        """The tokenizer's own chat template applied to ``messages`` (and ``tools`` as OpenAI function schemas),
        with this format's ``thinking``."""
        return _template_text(self.tokenizer, messages, generation, self.thinking, tools)

    def opening(self, content: str, tools: list[ToolSpec] | None = None) -> list[int]:
        """The system message that opens a chat: with ``tools``, the template's rendering of it with ``tools=``
        (the model's own tool prompt, e.g. Qwen's ``# Tools ... <tools></tools>``; it needs :attr:`renders_tools`),
        else its segment. The segments that follow are appended as usual: :func:`_probe_tools` verified that this
        tokenizes as the template's rendering of the whole chat with ``tools=``."""
        if not tools:
            return self.message("system", content, first=True)
        if not self.renders_tools:
            why = self.tools_fallback or "it is not a template format"
            raise ValueError(f"chat format {self.name!r} does not render tools= ({why})")
        text = self.template_text([{"role": "system", "content": content}], tools=tools)
        written = CODECS[self.codecs.get("system", "raw")](content)
        if written and text.count(written) == 1:  # the content is data, as in message()
            i = text.index(written)
            return self._wrap(text[:i], written, text[i + len(written) :])
        return self.encode(text)

    def thinking_history(self, name: str | None = None) -> str:
        """The :data:`THINKING_HISTORY` mode ``name`` (an unknown name lists the valid ones); None: the template's
        own, ``strip`` where it drops earlier thinking (:attr:`drops_thinking`), else ``keep``."""
        if name is None:
            return "strip" if self.drops_thinking else "keep"
        THINKING_HISTORY.get(name)
        return name

    @property
    def opened(self) -> str:
        """The text the generation prompt writes into the assistant's content (Qwen3 with ``enable_thinking``
        False: an empty ``<think>`` block), "" where it is just the assistant prefix: a sampled turn's content,
        as the template would be given it, is this followed by the completion's text."""
        pre = self.prefix("assistant")
        return self.generation[len(pre) :] if self.generation.startswith(pre) else ""

    def generation_prompt(self, role: str = "assistant") -> list[int]:
        return self.encode(self.generation if role == "assistant" else self.prefix(role))

    def close_completion(self, completion_ids: list[int]) -> list[int]:
        """Tokens that close an assistant turn after a completion: the assistant suffix (ChatML's end tag and
        newline), without the end token when the completion generated it."""
        suffix = self.suffixes["assistant"]
        if completion_ids and completion_ids[-1] == self.end_id:
            return self.encode(suffix[suffix.index(self.end) + len(self.end) :])
        return self.encode(suffix)

    def render(
        self,
        messages: list[dict[str, str]] | list[Message],
        add_generation_prompt: bool = True,
        tools: list[ToolSpec] | None = None,
    ) -> list[int]:
        """A chat's tokens, segment by segment; ``tools``: the opening system message carries them as the template
        renders them (:meth:`opening`)."""
        ids: list[int] = []
        for i, m in enumerate(messages):
            role, content = (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])
            if i == 0 and tools:
                if role != "system":
                    raise ValueError(f"tools= needs a chat that opens with a system message, not a {role} one")
                ids += self.opening(content, tools)
                continue
            ids += self.message(role, content, first=i == 0)
        if add_generation_prompt:
            ids += self.generation_prompt()
        return ids


def _size(tokenizer: Any) -> int | None:
    try:
        return len(tokenizer)  # a tokenizer given new tokens gets its formats again
    except TypeError:
        return None


CODECS: dict[str, Callable[[str], str]] = {"raw": lambda s: s, "json": lambda s: json.dumps(s, ensure_ascii=False)}
"""How a role's content is written into its segment (ChatFormat.codecs)."""

# name -> fn(tokenizer, thinking) -> ChatFormat
CHAT_FORMATS: Registry[Callable[[Any, bool | None], ChatFormat]] = Registry("chat format")
CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"


def default_chat_format(tokenizer: Any) -> str:
    """``chatml`` for a tokenizer whose vocabulary has ``<|im_start|>`` and ``<|im_end|>``, else ``template``."""
    vocab = tokenizer.get_vocab()
    return "chatml" if CHATML_START in vocab and CHATML_END in vocab else "template"


_said: set[str] = set()


def notice(text: str) -> None:
    """One line on stderr, once per process for the same text."""
    if text not in _said:
        _said.add(text)
        print(f"envace: {text}", file=sys.stderr, flush=True)


def _model_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def _template_text(
    tokenizer: Any,
    messages: list[dict[str, str]],
    generation: bool,
    thinking: bool | None,
    tools: list[ToolSpec] | None = None,
) -> str:
    kw: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
    if tools:
        kw["tools"] = [t.to_openai() for t in tools]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kw)


@CHAT_FORMATS.register("chatml")
def chatml_format(tokenizer: Any, thinking: bool | None = None) -> ChatFormat:
    """``<|im_start|>role\ncontent<|im_end|>\n`` (SmolLM2, Qwen). A vocabulary without ``<|im_end|>`` ends turns
    with its eos token instead (``<|im_start|>`` is then plain text). With ``thinking`` set, the generation
    prompt is the template's for that ``enable_thinking`` (Qwen3: an empty ``<think>`` block when False)."""
    vocab = tokenizer.get_vocab()
    end = CHATML_END if CHATML_END in vocab else tokenizer.eos_token
    if end is None:
        raise ValueError(f"tokenizer {_model_name(tokenizer)!r} has neither <|im_end|> nor an eos token to end a turn")
    start = CHATML_START
    generation = f"{start}assistant\n"
    if thinking is not None:
        generation = _chatml_generation(tokenizer, generation, thinking)
    return ChatFormat(
        tokenizer,
        {r: f"{start}{r}\n" for r in ROLES},
        {r: f"{end}\n" for r in ROLES},
        generation,
        end,
        name="chatml",
        thinking=thinking,
    )


def _chatml_generation(tokenizer: Any, plain: str, thinking: bool) -> str:
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    try:
        before, after = (_template_text(tokenizer, chat, g, thinking) for g in (False, True))
    except Exception as e:  # noqa: BLE001 - a template's own error (jinja, missing template) is the reason
        notice(
            f"{_model_name(tokenizer)}: thinking={thinking} is ignored: "
            f"its chat template fails ({type(e).__name__}: {str(e)[:120]})"
        )
        return plain
    generation = after[len(before) :]
    if not after.startswith(before) or not generation.startswith(plain):
        notice(
            f"{_model_name(tokenizer)}: thinking={thinking} is "
            "ignored: the template's generation prompt is not ChatML's"
        )
        return plain
    return generation


class TemplateMismatch(ValueError):
    """A chat template that cannot be rendered by appending segments (the reason is the message)."""


PROBE_CHAT = [
    {"role": "system", "content": "You are a probe. Answer briefly."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
    {"role": "tool", "content": '{"temperature": 21, "unit": "C"}'},
    {"role": "tool", "content": '{"humidity": "40%"}'},
    {"role": "assistant", "content": "It is 21 degrees and 40% humid in Paris."},
]
"""The chat a derived template format must render exactly as the template does (one of each turn envace appends:
system, user, reply, call, two tool results in a row, reply)."""

PROBE_TOOLS = [
    ToolSpec(
        "get_weather",
        "The current weather in a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
    ToolSpec("get_humidity", "The relative humidity in a city.", {"type": "object", "properties": {}}),
]
"""The tools :data:`PROBE_CHAT` is rendered with to check a template's ``tools=`` rendering (:func:`_probe_tools`)."""

_PLACEHOLDER = 'envace-probe "{}" 7'  # a quote tells a template that writes content as a JSON string (tojson)


def _segment(render: Callable[..., str], before: list[dict[str, str]], role: str) -> tuple[str, str, str]:
    """``(prefix, suffix, codec)`` of a ``role`` message appended to ``before``, by differencing renderings."""
    content = _PLACEHOLDER.format(role)
    head = render(before) if before else ""
    full = render(before + [{"role": role, "content": content}])
    where = f"a {role} message " + (f"after {', '.join(m['role'] for m in before)}" if before else "opening a chat")
    if not full.startswith(head):
        raise TemplateMismatch(f"{where} changes the text before it")
    delta = full[len(head) :]
    for codec, written in CODECS.items():
        text = written(content)
        if delta.count(text) == 1:
            i = delta.index(text)
            return delta[:i], delta[i + len(text) :], codec
    raise TemplateMismatch(f"{where} is not rendered as a segment of its own (its content is missing or merged)")


def derive_template_format(tokenizer: Any, thinking: bool | None = None) -> ChatFormat:
    """Segments differenced from the tokenizer's own chat template (``apply_chat_template(tokenize=False)`` of
    chats with placeholder contents), then verified: :data:`PROBE_CHAT` appended segment by segment must be the
    template's own tokenization of it, and the generation prompt the same after a user turn and a tool result.
    Raises :class:`TemplateMismatch` (or the template's own error) when it cannot be used."""

    def render(msgs: list[dict[str, str]], generation: bool = False) -> str:
        return _template_text(tokenizer, msgs, generation, thinking)

    def msg(role: str) -> dict[str, str]:
        return {"role": role, "content": _PLACEHOLDER.format(role)}

    prefixes, suffixes, firsts, codecs = {}, {}, {}, {}
    firsts["system"], suffixes["system"], codecs["system"] = _segment(render, [], "system")
    prefixes["user"], suffixes["user"], codecs["user"] = _segment(render, [msg("system")], "user")
    try:
        firsts["user"], _, _ = _segment(render, [], "user")
    except Exception:  # noqa: BLE001 - a template that needs a system message first: chats here open with one
        pass
    prefixes["assistant"], suffixes["assistant"], codecs["assistant"] = _segment(
        render, [msg("system"), msg("user")], "assistant"
    )
    prefixes["tool"], suffixes["tool"], codecs["tool"] = _segment(
        render, [msg("system"), msg("user"), msg("assistant")], "tool"
    )
    try:
        prefixes["system"], _, _ = _segment(render, [msg("system"), msg("user"), msg("assistant")], "system")
    except Exception:  # noqa: BLE001 - many templates take a system message only first
        pass
    chat = [msg("system"), msg("user")]
    head, full = render(chat), render(chat, True)
    if not full.startswith(head):
        raise TemplateMismatch("the generation prompt changes the text before it")
    fmt = ChatFormat(
        tokenizer,
        prefixes,
        suffixes,
        full[len(head) :],
        _end_token(tokenizer, suffixes["assistant"]),
        firsts,
        codecs,
        name="template",
        thinking=thinking,
    )
    _verify(fmt, render)
    fmt.tools_fallback = _probe_tools(fmt)
    reply = PROBE_CHAT[2]["content"]
    if fmt.generation == prefixes["assistant"] and fmt.encode(fmt.generation) + fmt.encode(reply) != fmt.encode(
        fmt.generation + reply
    ):
        notice(
            f"{_model_name(tokenizer)}: its tokenizer merges the end of the generation prompt "
            f"{fmt.generation[-8:]!r} with the text after it, so a sampled reply kept in a context "
            "is tokenized unlike the template's re-rendering of it (contexts stay as sampled)"
        )
    return fmt


def _end_token(tokenizer: Any, suffix: str) -> str:
    """The first special token in an assistant's suffix (the end of turn)."""
    added = getattr(tokenizer, "added_tokens_encoder", None) or {}
    specials = set(added) | set(getattr(tokenizer, "all_special_tokens", []))
    found = [(suffix.find(t), -len(t), t) for t in specials if t and t in suffix]
    if not found:
        raise TemplateMismatch(f"no special token ends an assistant turn (its suffix is {suffix!r})")
    return min(found)[2]


def _where_they_differ(fmt: ChatFormat, got: list[int], want: list[int]) -> str:
    """``at token N (near '...')``: the first token where ``got`` leaves ``want``, with the text of ``want`` there."""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"at token {at} (near {fmt.tokenizer.decode(want[max(0, at - 8) : at + 8])!r})"


def _verify(fmt: ChatFormat, render: Callable[..., str]) -> None:
    want = fmt.encode(render(PROBE_CHAT))
    got = fmt.render(PROBE_CHAT, add_generation_prompt=False)
    if got != want:
        raise TemplateMismatch(
            f"the probe chat's segments differ from the template's rendering {_where_they_differ(fmt, got, want)}"
        )
    upto_tool = PROBE_CHAT[:-1]
    if render(upto_tool, True) != render(upto_tool) + fmt.generation:
        raise TemplateMismatch("the generation prompt after a tool result differs from the one after a user turn")


def _probe_tools(fmt: ChatFormat) -> str | None:
    """Why the template's ``tools=`` rendering cannot open Act's chat (one line), or None when it can: with
    :data:`PROBE_TOOLS` it must change the rendering of a system and a user turn and name every tool, inside the
    rendering of the system message alone, and :data:`PROBE_CHAT` opened by that (:meth:`ChatFormat.opening`), the
    other segments appended, must be the template's tokenization of the whole chat with ``tools=``, generation
    prompt included."""
    tools, head = PROBE_TOOLS, PROBE_CHAT[:2]
    try:
        with_tools = fmt.template_text(head, tools=tools)
        if with_tools == fmt.template_text(head):
            return "it ignores tools="
        if not all(t.name in with_tools for t in tools):
            return "its tools= rendering does not name the tools"
        full = fmt.template_text(PROBE_CHAT, tools=tools)
        upto_tool = PROBE_CHAT[:-1]
        generation = fmt.template_text(upto_tool, True, tools)[len(fmt.template_text(upto_tool, tools=tools)) :]
        alone = fmt.template_text(PROBE_CHAT[:1], tools=tools)
    except Exception as e:  # noqa: BLE001 - the template's own error (Llama 3.1: tools need a first user message)
        return " ".join(f"its chat template fails with tools= ({type(e).__name__}: {str(e)[:160]})".split())
    if not all(t.name in alone for t in tools):
        return (
            "the system message alone, rendered with tools=, does not "
            "hold them (Llama 3.1 writes them in the first user message)"
        )
    if generation != fmt.generation:
        return "its generation prompt changes with tools="
    opened = fmt.render(PROBE_CHAT, add_generation_prompt=False, tools=tools)  # as Act's context is built
    want = fmt.encode(full)
    if opened != want:
        return (
            "the probe chat opened by its tools= system turn differs from its "
            f"rendering with tools= {_where_they_differ(fmt, opened, want)}"
        )
    return None


@CHAT_FORMATS.register("template")
def template_format(tokenizer: Any, thinking: bool | None = None) -> ChatFormat:
    """The tokenizer's own chat template as segments (:func:`derive_template_format`); a template that cannot
    be rendered by appending (Mistral's, which merges the system prompt into a user turn; one that raises) gives
    the ChatML format instead, with a one-line notice naming the model and the reason (``fallback``)."""
    try:
        return derive_template_format(tokenizer, thinking)
    except Exception as e:  # noqa: BLE001 - TemplateMismatch, or the template's own error (jinja, alternation rules)
        reason = (
            str(e)
            if isinstance(e, TemplateMismatch)
            else f"its chat template fails ({type(e).__name__}: {str(e)[:160]})"
        )
    reason = " ".join(reason.split())  # one line
    fmt = chatml_format(tokenizer, thinking)
    fmt.fallback = reason
    notice(
        f"{_model_name(tokenizer)}: chat template not used, rendering ChatML (end of turn {fmt.end}) instead: {reason}"
    )
    return fmt


def earlier_answer(content: str) -> str:
    """An assistant turn's content as Qwen3's template writes it once a later user message follows: the text after
    its last ``</think>``, leading newlines dropped; content without ``</think>`` is left as it is."""
    return content.split(THINK_CLOSE)[-1].lstrip("\n") if THINK_CLOSE in content else content


# name -> fn(content) -> the content an assistant turn is written with once a later user message follows it
THINKING_HISTORY: Registry[Callable[[str], str]] = Registry("thinking history")
THINKING_HISTORY.add("keep", lambda content: content)
THINKING_HISTORY.add("strip", earlier_answer)


def with_thinking_history(messages: list[Message], name: str) -> list[Message]:
    """``messages`` with each assistant message before the last user message written as :data:`THINKING_HISTORY`
    ``name`` says (``strip``: without its thinking); the others as they are."""
    written = THINKING_HISTORY.get(name)
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    return [
        Message(m.role, written(m.content), m.tool_calls) if m.role == "assistant" and i < last_user else m
        for i, m in enumerate(messages)
    ]


THINK_PROBE = [
    Message("system", "You are a probe. Answer briefly."),
    Message("user", "What is 2 + 2?"),
    Message("assistant", "<think>\nAdd two and two.\n</think>\n\nIt is 4."),
    Message("user", "And 3 + 3?"),
]
"""The chat that tells whether a template drops earlier thinking (:func:`_probe_thinking`)."""


def _probe_thinking(fmt: ChatFormat) -> bool:
    """Whether the tokenizer's chat template drops the thinking of an assistant turn that a user message follows
    (:data:`THINK_PROBE`); False where it keeps it or fails. Where it drops it otherwise than :func:`earlier_answer`
    (the ``strip`` rendering differs from the template's), a one-line notice says so."""
    try:
        text = fmt.template_text([m.to_dict() for m in THINK_PROBE])
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: no evidence that it drops thinking
        return False
    if "Add two and two." in text:
        return False
    want, got = fmt.encode(text), fmt.render(with_thinking_history(THINK_PROBE, "strip"), add_generation_prompt=False)
    if got != want:
        notice(
            f"{_model_name(fmt.tokenizer)}: its chat template drops earlier thinking, but not as envace's "
            f"thinking_history 'strip' does: the probe chat differs {_where_they_differ(fmt, got, want)}"
        )
    return True


def tool_message_content(obs: Any) -> str:
    return json.dumps(obs, ensure_ascii=False)
