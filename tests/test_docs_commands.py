"""Every shell command shown in README.md, docs/*.md and results/README.md must run as written.

The check reads the fenced code blocks marked bash, sh, shell or console, splits them into
commands (line continuations, ``&&``/``;``/``|`` chains, comments, heredocs, environment-variable
prefixes) and checks each without running it:

- ``autoshard ...`` (also ``.venv/bin/autoshard``, ``python -m autoshard``, ``torchrun ... -m
  autoshard``): the subcommand exists, every option given is one of its options (introspected
  from the Typer app), and ``--opt KEY=VALUE`` names an option of the sharder it goes to;
- ``.venv/bin/python path/to/script.py --flag``: the script exists and declares ``--flag`` in an
  ``add_argument`` call; ``scripts/*.sh`` and ``bash path.sh``: the file exists;
- a few plain tools (``cd``, ``cat``, ``git``, ...) are accepted as they are; anything else, and
  a bare ``python``/``autoshard`` in a document that never activates ``.venv``, is reported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                               ROOT / "results" / "README.md")
README_MAX_LINES = 200
SETUP_BLOCK = """```bash
scripts/setup.sh && .venv/bin/autoshard demo      # set up, then run the main job end to end
.venv/bin/python -m pytest -q                      # run the tests
```"""

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
#: Commands accepted without checks (their arguments are not the project's to validate).
PLAIN_TOOLS = frozenset({
    "cd", "cat", "mkdir", "source", ".", "pip", "git", "ls", "head", "tail", "echo", "rm",
    "cp", "mv", "export", "wandb", "ruff", "mypy", "pytest", "less", "grep", "diff", "tee",
})
#: Commands that run the command after their own options (wrapper, how many arguments it takes
#: before the wrapped command when they are not options).
WRAPPERS: dict[str, int] = {"nice": 0, "time": 0, "flock": 1, "timeout": 1, "env": 0}
VENV_BIN = ".venv/bin/"
ACTIVATE = ("source", ".venv/bin/activate")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
SEPARATORS = frozenset({"&&", "||", ";", "|", "&", "(", ")"})
FD_REDIRECT = re.compile(r"(?<![^\s;&|(])\d+(?=[<>])")


@dataclass(frozen=True)
class Command:
    """One simple command found in a document.

    Attributes:
        words: The command's words, with comments, redirections and separators removed.
        line: 1-based line of the document where the command starts.
        activated: Whether the document ran ``source .venv/bin/activate`` before it.
    """

    words: tuple[str, ...]
    line: int
    activated: bool = False

    def __str__(self) -> str:
        return f"line {self.line}: {shlex.join(self.words)}"


# --- extraction -------------------------------------------------------------------------------

def shell_blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    """Yields (first line number, lines) of each fenced block marked as shell or console."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = re.match(r"^(\s*)(```+|~~~+)\s*([\w-]*)", lines[index])
        if not match:
            index += 1
            continue
        fence, language = match.group(2), match.group(3).lower()
        start = index + 1
        end = start
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if language in SHELL_LANGUAGES:
            yield start + 1, lines[start:end]
        index = end + 1


def strip_comment(line: str) -> str:
    """The line without a ``#`` comment (a ``#`` at the start or after a blank, unquoted)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def logical_lines(first: int, lines: Sequence[str]) -> Iterator[tuple[int, str]]:
    """Yields (line number, command line) of a shell block.

    Joins ``\\`` continuations, drops heredoc bodies and comments, and in a block that shows
    prompts (``$ ``) keeps only the prompted lines (the others are output).
    """
    prompted = any(line.lstrip().startswith("$ ") for line in lines)
    index = 0
    while index < len(lines):
        number, line = first + index, lines[index]
        index += 1
        stripped = line.lstrip()
        if prompted:
            if not stripped.startswith("$ "):
                continue
            line = stripped[2:]
        while line.rstrip().endswith("\\") and index < len(lines):
            line = line.rstrip()[:-1] + " " + lines[index].strip()
            index += 1
        line = strip_comment(line)
        heredoc = HEREDOC.search(line)
        if heredoc:
            while index < len(lines) and lines[index].strip() != heredoc.group(2):
                index += 1
            index += 1
        if line.strip():
            yield number, line


def split_commands(line: str) -> list[list[str]]:
    """Splits a command line at ``&&``, ``||``, ``;``, ``|`` and ``&``, dropping redirections."""
    line = FD_REDIRECT.sub("", line)  # `2>file`, `2>&1`: the descriptor is no argument
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in SEPARATORS:
            commands.append([])
        elif set(token) <= set("<>&|") and ("<" in token or ">" in token):
            skip_next = not token.endswith("&") or token == ">&"
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def extract_commands(text: str) -> list[Command]:
    """Every simple command of the document's shell blocks, in order."""
    found: list[Command] = []
    activated = False
    for first, lines in shell_blocks(text):
        for number, line in logical_lines(first, lines):
            for words in split_commands(line):
                found.append(Command(tuple(words), number, activated))
                if tuple(words[:2]) in (ACTIVATE, (".", ACTIVATE[1])):
                    activated = True
    return found


# --- checks ------------------------------------------------------------------------------------

@functools.cache
def cli_tree() -> Any:
    """The autoshard CLI as a click command tree (Typer's), built without running anything."""
    import typer

    from autoshard.cli import app
    return typer.main.get_command(app)


def command_options(command: Any) -> frozenset[str]:
    """Every option string of a click command: ``--x``, ``-x`` and ``--no-x`` forms."""
    names = {"--help"}
    for param in command.params:
        names.update(opt for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-"))
    return frozenset(names)


@functools.cache
def sharder_options(name: str) -> frozenset[str] | None:
    """The options sharder ``name`` takes, or None when no sharder has that name."""
    from autoshard import sharders
    if name not in sharders.sharder_names():
        return None
    return frozenset(sharders.accepted_options(name))


def option_name(word: str) -> str | None:
    """``--x`` of ``--x`` or ``--x=v``; None for a value (negative numbers included)."""
    if not word.startswith("-") or word == "-" or re.fullmatch(r"-[\d.e+-]+", word):
        return None
    return word.split("=", 1)[0]


def option_values(words: Sequence[str], *names: str) -> list[str]:
    """The values given to any of the options ``names`` (``--x v`` and ``--x=v`` forms)."""
    values = []
    for i, word in enumerate(words):
        if word in names and i + 1 < len(words):
            values.append(words[i + 1])
        elif "=" in word and word.split("=", 1)[0] in names:
            values.append(word.split("=", 1)[1])
    return values


def check_sharder_opts(path: str, words: Sequence[str]) -> list[str]:
    """Problems with the ``--opt [SHARDER.]KEY=VALUE`` options of an autoshard command."""
    named = option_values(words, "-s", "--sharder")
    named += [n for value in option_values(words, "--sharders") for n in value.split(",") if n]
    problems = []
    for opt in option_values(words, "--opt"):
        key = opt.split("=", 1)[0]
        if "=" not in opt:
            problems.append(f"`--opt {opt}` is not KEY=VALUE")
            continue
        targets = named
        if "." in key:
            prefix, key = key.split(".", 1)
            if sharder_options(prefix) is None:
                problems.append(f"`--opt {opt}`: no sharder named {prefix!r}")
                continue
            targets = [prefix]
        for sharder in targets:
            accepted = sharder_options(sharder)
            if accepted is None:
                problems.append(f"`autoshard {path}`: no sharder named {sharder!r}")
            elif key not in accepted:
                problems.append(f"`--opt {opt}`: sharder {sharder!r} takes no option {key!r} "
                                f"(it takes {', '.join(sorted(accepted)) or 'none'})")
    return problems


def check_autoshard(args: Sequence[str]) -> list[str]:
    """Problems with ``autoshard ARGS``: unknown subcommand or options, bad sharder options."""
    command = cli_tree()
    path: list[str] = []
    rest = list(args)
    while hasattr(command, "commands"):
        if not rest:
            return [f"`autoshard {' '.join(path)}` needs a subcommand"] if path else []
        if rest[0] == "--help":
            return []
        if rest[0] not in command.commands:
            return [f"`autoshard {' '.join(path + rest[:1])}`: no such command "
                    f"(known: {', '.join(sorted(command.commands))})"]
        path.append(rest.pop(0))
        command = command.commands[path[-1]]
    known = command_options(command)
    name = " ".join(path)
    problems = [f"`autoshard {name}` has no option {opt}"
                for opt in map(option_name, rest) if opt is not None and opt not in known]
    return problems + check_sharder_opts(name, rest)


@functools.cache
def script_flags(path: Path) -> frozenset[str]:
    """The option strings of every ``add_argument(...)`` call in a Python script."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    flags = {"-h", "--help"}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            flags.update(arg.value for arg in node.args
                         if isinstance(arg, ast.Constant) and isinstance(arg.value, str))
    return frozenset(flags)


def check_script(args: Sequence[str], root: Path) -> list[str]:
    """Problems with ``python SCRIPT ARGS``: a missing script or a flag it does not declare."""
    script = root / args[0]
    if not script.is_file():
        return [f"no script {args[0]}"]
    flags = script_flags(script)
    return [f"{args[0]} has no option {opt}"
            for opt in map(option_name, args[1:]) if opt is not None and opt not in flags]


def check_python(args: Sequence[str], root: Path) -> list[str]:
    """Problems with ``python ARGS``: ``-m autoshard``, ``-m MODULE``, a script, ``-c``."""
    if not args or args[0] == "-c":
        return []
    if args[0] == "-m" and len(args) > 1:
        if args[1] == "autoshard":
            return check_autoshard(args[2:])
        if importlib.util.find_spec(args[1].split(".")[0]) is None:
            return [f"no module {args[1]}"]
        return []
    if args[0].endswith(".py"):
        return check_script(args, root)
    return [f"cannot check `python {' '.join(args)}`"]


def check_torchrun(args: Sequence[str]) -> list[str]:
    """Problems with ``torchrun ... -m autoshard ARGS`` (its own options are not checked)."""
    if "-m" in args and args[args.index("-m") + 1:][:1] == ["autoshard"]:
        return check_autoshard(args[args.index("-m") + 2:])
    return [f"cannot check `torchrun {' '.join(args)}`"]


def unwrap(words: Sequence[str]) -> list[str]:
    """The command without environment assignments and wrappers (``nice -n 10``, ``flock F``)."""
    rest = list(words)
    while rest:
        if ENV_ASSIGNMENT.match(rest[0]):
            rest.pop(0)
        elif rest[0] in WRAPPERS:
            positional = WRAPPERS[rest.pop(0)]
            while rest and rest[0].startswith("-"):
                flag = rest.pop(0)
                if flag in ("-n", "-w", "-E") and rest:
                    rest.pop(0)
            del rest[:positional]
        else:
            break
    return rest


def check_command(command: Command, root: Path = ROOT) -> list[str]:
    """What is wrong with one command (an empty list when it would run as written)."""
    words = unwrap(command.words)
    if not words:
        return []
    program, args = words[0], words[1:]
    venv = program.startswith(VENV_BIN)
    name = program.removeprefix(VENV_BIN).removeprefix("./")
    if name in ("python", "python3", "autoshard", "torchrun"):
        problems = [] if venv or command.activated else [
            f"`{program}` needs `.venv/bin/{name}` (or `source .venv/bin/activate` first)"]
        if name == "autoshard":
            return problems + check_autoshard(args)
        if name == "torchrun":
            return problems + check_torchrun(args)
        return problems + check_python(args, root)
    if name == "bash" and args:
        return [] if (root / args[0]).is_file() else [f"no script {args[0]}"]
    if name.endswith(".sh"):
        return [] if (root / name).is_file() else [f"no script {name}"]
    if name in PLAIN_TOOLS:
        return []
    return [f"unknown command `{program}`"]


def document_problems(path: Path) -> list[str]:
    """Every problem of every command in a document, each naming its line."""
    return [f"{path.name}: {command}: {problem}"
            for command in extract_commands(path.read_text(encoding="utf-8"))
            for problem in check_command(command)]


# --- the documents -----------------------------------------------------------------------------

@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_runs_as_written(path: Path) -> None:
    """Each document exists, shows commands, and each command would run from a fresh clone."""
    assert path.is_file(), f"{path} is missing"
    assert extract_commands(path.read_text(encoding="utf-8")), f"{path.name} shows no command"
    problems = document_problems(path)
    assert not problems, "\n".join(problems)


def test_readme_is_short() -> None:
    """README.md stays an overview; the rest lives in docs/ and results/README.md."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_opens_with_the_setup_commands() -> None:
    """CI runs README's two set-up commands; they stay first and byte for byte."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# autoshard\n\n" + SETUP_BLOCK + "\n")


def heading_anchors(path: Path) -> frozenset[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return frozenset(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
                     for title in re.findall(r"^#+ (.+)$", text, flags=re.M))


def test_relative_links_resolve() -> None:
    """Every relative link of the checked documents points to a file, and heading, that exist."""
    missing = []
    for path in DOCUMENTS:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)",
                                         path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            linked = (path.parent / target) if target else path
            if not linked.exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                missing.append(f"{path.relative_to(ROOT)}: {target}#{anchor}")
    assert not missing, "\n".join(missing)


# --- the extractor and the checks themselves ---------------------------------------------------

def words_of(text: str) -> list[tuple[str, ...]]:
    """The commands of a document, as word tuples."""
    return [c.words for c in extract_commands(text)]


def test_extractor_splits_chains_continuations_comments_and_heredocs() -> None:
    """Continuations join, chains split, comments, heredoc bodies and output lines drop."""
    text = "\n".join([
        "```bash",
        "scripts/setup.sh && .venv/bin/autoshard demo   # set up",
        ".venv/bin/autoshard plan -t x.yaml \\",
        "    -s recshard -o plan.json",
        "cat > x.yaml <<'EOF'",
        "tables: [{name: a, rows: 10, dim: 4}]   # --not-an-option",
        "EOF",
        "COLUMNS=300 .venv/bin/autoshard sharders | head -3",
        ".venv/bin/autoshard hardware show x --devices 16 > c.yaml 2>&1",
        "```",
        "```console",
        "$ .venv/bin/autoshard hardware list",
        "8xH100-80GB --output-line",
        "```",
        "```yaml",
        "autoshard: not a command",
        "```",
    ])
    assert words_of(text) == [
        ("scripts/setup.sh",), (".venv/bin/autoshard", "demo"),
        (".venv/bin/autoshard", "plan", "-t", "x.yaml", "-s", "recshard", "-o", "plan.json"),
        ("cat",),
        ("COLUMNS=300", ".venv/bin/autoshard", "sharders"), ("head", "-3"),
        (".venv/bin/autoshard", "hardware", "show", "x", "--devices", "16"),
        (".venv/bin/autoshard", "hardware", "list"),
    ]


def problems_of(line: str) -> list[str]:
    """The problems the checks report for a one-line bash block."""
    return [p for c in extract_commands(f"```bash\n{line}\n```") for p in check_command(c)]


def test_wrong_options_and_commands_are_reported() -> None:
    """A misspelt option, an unknown subcommand, a bad sharder option and a bare python fail."""
    assert problems_of(".venv/bin/autoshard plan -t default --sharder recshard --devices 8") == []
    assert problems_of(".venv/bin/autoshard export p.json -t default --no-fit") == []
    assert "has no option --devcies" in " ".join(
        problems_of(".venv/bin/autoshard plan -t default --devcies 8"))
    assert "no such command" in " ".join(problems_of(".venv/bin/autoshard plna -t default"))
    assert "no such command" in " ".join(problems_of(".venv/bin/autoshard hardware shwo x"))
    assert "takes no option 'mip_gap'" in " ".join(
        problems_of(".venv/bin/autoshard plan -t default -s recshard --opt mip_gap=0.01"))
    assert problems_of(".venv/bin/autoshard compare --suite tiny "
                       "--opt recshard.mip_rel_gap=0.01") == []
    assert "no sharder named 'recshrad'" in " ".join(
        problems_of(".venv/bin/autoshard compare --suite tiny --opt recshrad.stall=1"))
    assert "needs `.venv/bin/python3`" in " ".join(problems_of("python3 scripts/headline.py"))
    assert "unknown command" in " ".join(problems_of("frobnicate --now"))


def test_scripts_and_wrapped_commands_are_checked() -> None:
    """Scripts must exist and declare their flags; wrappers and plain tools pass through."""
    assert problems_of(".venv/bin/python benchmarks/bench_ppo.py --time-limit 10") == []
    assert "has no option --time-limt" in " ".join(
        problems_of(".venv/bin/python benchmarks/bench_ppo.py --time-limt 10"))
    assert "no script" in " ".join(problems_of(".venv/bin/python benchmarks/nothing.py"))
    assert "no script" in " ".join(problems_of("scripts/nothing.sh"))
    assert problems_of("nice -n 10 .venv/bin/autoshard train --split") == []
    assert "has no option --splitt" in " ".join(
        problems_of("flock /tmp/x.lock .venv/bin/autoshard train --splitt"))
    assert problems_of("OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q") == []
    assert problems_of("cd /tmp && git status") == []


def test_activating_the_venv_allows_bare_commands() -> None:
    """After ``source .venv/bin/activate`` a bare ``autoshard`` is runnable (and still checked)."""
    block = "```bash\nsource .venv/bin/activate\nautoshard plan -t default --nope\n```"
    problems = [p for c in extract_commands(block) for p in check_command(c)]
    assert problems == ["`autoshard plan` has no option --nope"]


# --- outputs: nothing written into the checkout ------------------------------------------------

#: Options that name a file or folder a command writes (``--table-file``: ``synth``'s output,
#: ``profile``'s input).
OUTPUT_OPTIONS = ("-o", "--output", "--out", "--export", "--export-policy", "--fitted-plan",
                  "--plot", "--report", "--save-partial", "--parts")
SYNTH_OUTPUTS = ("--table-file",)
#: Where the documents' commands may write: runs/ (ignored by git), and results/ where a
#: command regenerates committed figures and says so by naming the folder.
WRITABLE = ("runs/", "results/")


def redirect_targets(line: str) -> list[str]:
    """The files a command line's ``>``/``>>`` redirections write."""
    lexer = shlex.shlex(FD_REDIRECT.sub("", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    tokens = list(lexer)
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in (">", ">>")]


def written_paths(path: Path) -> list[tuple[str, str, Command | None]]:
    """(file or folder written, the command line that writes it, the command) of a
    document: output options of autoshard commands and scripts, and shell redirections."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[str, str, Command | None]] = []
    for command in extract_commands(text):
        words = unwrap(command.words)
        if words and words[0].removeprefix(VENV_BIN) in ("autoshard", "python", "torchrun"):
            options = OUTPUT_OPTIONS + (SYNTH_OUTPUTS if "synth" in words[1:2] else ())
            found += [(v, shlex.join(words), command) for v in option_values(words, *options)]
    for first, lines in shell_blocks(text):
        for _, line in logical_lines(first, lines):
            found += [(target, line, None) for target in redirect_targets(line)]
    return found


def test_documented_commands_write_under_runs_or_named_results() -> None:
    """Every file a documented command writes lies under runs/ (ignored by git) or, where a
    command regenerates committed figures, under results/ as it says: run from a clone, the
    documents' commands leave `git status` clean."""
    outside = [f"{path.relative_to(ROOT)}: `{line}` writes {target}"
               for path in DOCUMENTS for target, line, _ in written_paths(path)
               if not target.startswith(WRITABLE)]
    assert not outside, "\n".join(outside)


def test_documented_examples_write_distinct_files() -> None:
    """No two different documented commands write the same file, so that following one page
    never overwrites what another page's example made (folders, which runs resume into, and
    results/ excepted)."""
    writers: dict[str, set[str]] = {}
    for path in DOCUMENTS:
        for target, line, _ in written_paths(path):
            if Path(target).suffix and not target.startswith("results/"):
                writers.setdefault(target, set()).add(" ".join(line.split()))
    shared = {t: sorted(lines) for t, lines in writers.items() if len(lines) > 1}
    assert not shared, "\n".join(f"{t}: {lines}" for t, lines in shared.items())


def test_every_default_output_is_under_runs() -> None:
    """A command given no output writes under runs/: never into the checkout itself."""
    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}".strip())
        for param in getattr(command, "params", []):
            yield path, param

    bad = []
    for path, param in walk(cli_tree(), ""):
        named = set(param.opts) & {"-o", "--output", "--out"}
        default = param.default
        if (named and default not in (None, "") and not callable(default)
                and not str(default).startswith("runs/")):
            bad.append(f"autoshard {path} {sorted(named)[0]}: default {default}")
    assert not bad, "\n".join(bad)


def test_the_redirect_and_output_extractors_see_what_they_look_for() -> None:
    assert redirect_targets("autoshard hardware show x > c.yaml 2>&1") == ["c.yaml"]
    assert redirect_targets("mkdir -p runs && cat > runs/t.yaml <<'EOF'") == ["runs/t.yaml"]
    assert redirect_targets("autoshard plan -t a.yaml") == []


def section_blocks(text: str, heading: str) -> list[str]:
    """The shell blocks of the section under ``heading`` (to the next heading of its level)."""
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    section = text[start:end if end > 0 else len(text)]
    return ["\n".join(lines) for _, lines in shell_blocks(section)]


@pytest.mark.slow
def test_the_quick_start_and_default_outputs_leave_a_clone_clean(tmp_path: Path) -> None:
    """The README's quick start, run as written in a fresh clone, then commands given no
    output (`plan`, `serve study`), write only under runs/: `git status` stays clean."""
    import subprocess
    import sys

    from autoshard.torchrec import torchrec_unavailable

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    autoshard = f"{shlex.quote(sys.executable)} -m autoshard"
    script = "\n".join(section_blocks((ROOT / "README.md").read_text(encoding="utf-8"),
                                      "## Quick start: your own tables"))
    if torchrec_unavailable(load=True) is not None:
        script = script.replace(" --check", "")
    script = script.replace(".venv/bin/autoshard", autoshard) + "\n" + "\n".join([
        f"{autoshard} plan -t runs/my_tables.yaml -s lookup_greedy",
        f"{autoshard} serve study --requests 1000 --samples 2"])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    for made in ("runs/my_tables.yaml", "runs/plan.json", "runs/torchrec_plan.json",
                 "runs/serving/study.md"):
        assert (clone / made).is_file(), made
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=clone, capture_output=True, text=True, check=True).stdout
    assert status == "", status
