"""The code in the READMEs and the docs pages cannot drift: every runnable Python block is a file in examples/,
quoted verbatim under an `<!-- example: PATH -->` marker, and the files run as written; every other Python block in
docs/ parses; every `<!-- cli-help: fides-rag CMD -->` block is that command's --help."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fides_rag.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
READMES = [
    ROOT / "README.md",
    ROOT / "integrations/langchain-fides/README.md",
    ROOT / "integrations/llama-index-llms-fides/README.md",
]
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
MARKER = re.compile(r"<!-- example: (\S+) [^\n]*-->\n```python\n(.*?)```", re.DOTALL)
CLI_HELP = re.compile(r"<!-- cli-help: fides-rag ?([^\n]*?) -->\n```text\n(.*?)```", re.DOTALL)
HELP_COLUMNS = "100"

RUN_ELSEWHERE = {
    "quickstart_decoder.py": "test_decoder_quick_start_runs_and_prints_what_it_says (below)",
    "quickstart_batching.py": "test_batching_quick_start_runs_and_answers_every_question (below)",
    "quickstart_langchain.py": "integrations/langchain-fides/tests/integration_tests/"
    "test_lc_quickstart_and_leftovers.py",
    "quickstart_llamaindex.py": "integrations/llama-index-llms-fides/tests/test_fides_llm_quickstart_slow.py",
    "quickstart_agent.py": "integrations/langchain-fides/tests/integration_tests/test_lc_agents_real.py",
    "serve_openai.py": "tests/serve/test_server_real.py (against a running server)",
    "serve_langchain.py": "tests/serve/test_server_real.py (against a running server)",
    "serve_llamaindex.py": "tests/serve/test_server_real.py (against a running server)",
    "agents_http_openai.py": "tests/serve/test_server_real.py (against a running server)",
    "agents_http_langchain.py": "tests/serve/test_server_real.py (against a running server)",
    "agents_http_llamaindex.py": "tests/serve/test_server_real.py (against a running server)",
}
"""Quoted examples that a dedicated test runs (with checks of what they print); the others run in
test_docs_example_runs."""


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.DOTALL | re.MULTILINE)


def quoted_examples(page: Path) -> list[tuple[Path, str]]:
    return [((page.parent / path).resolve(), code) for path, code in MARKER.findall(page.read_text())]


def every_quoted_example() -> list[Path]:
    return sorted({path for page in READMES + DOC_PAGES for path, _ in quoted_examples(page)})


def run_example(path: Path, timeout: int = 600) -> list[str]:
    """Run an example file in a fresh interpreter (this one's sys.path), return its stdout lines."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{path.name} failed:\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


def check_quotes(page: Path) -> None:
    for path, code in quoted_examples(page):
        assert path.parent == ROOT / "examples" and path.is_file(), (
            f"{page.name}: the marker names {path}, not a file in examples/"
        )
        assert code == path.read_text(), f"{page.name} quotes {path.name} but differs from it; paste the file again"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_is_an_example_file_verbatim(readme):
    blocks = python_blocks(readme)
    assert blocks, f"{readme} has no python block"
    assert len(quoted_examples(readme)) == len(blocks), (
        f"{readme}: every ```python block must be an examples/ file, marked <!-- example: path -->"
    )
    check_quotes(readme)


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_docs_examples_are_files_verbatim_and_fragments_parse(page):
    check_quotes(page)
    quoted = {code for _, code in quoted_examples(page)}
    for block in python_blocks(page):
        if block not in quoted:  # a fragment, not meant to run alone: it must still be Python
            ast.parse(block, f"{page.name} fragment")


RUN_AFTER = re.compile(r"<!-- fragments run after: (\S+) -->")
NOT_RUN = "<!-- not run: "


def fragments(page: Path) -> list[tuple[str, str | None]]:
    """The page's Python blocks that quote no example, in order, each with why it is not run (None: it runs)."""
    text = page.read_text()
    quoted = {code for _, code in quoted_examples(page)}
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        if match.group(1) not in quoted:
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found.append(
                (match.group(1), before[len(NOT_RUN) : -len("-->")].strip() if before.startswith(NOT_RUN) else None)
            )
    return found


PAGES_WITH_FRAGMENTS = [page for page in DOC_PAGES if fragments(page)]


@pytest.mark.parametrize("page", PAGES_WITH_FRAGMENTS, ids=lambda p: p.name)
def test_a_fragment_that_does_not_run_says_why_on_the_page(page):
    text = page.read_text()
    for code, reason in fragments(page):
        if reason is not None:
            assert reason, f"{page.name}: a <!-- not run: --> marker needs its reason"
            assert "Not run" in text[: text.index("```python\n" + code)].rsplit("```", 1)[-1], (
                f"{page.name}: show readers why a block is not run (a note)"
            )


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_FRAGMENTS, ids=lambda p: p.name)
def test_docs_fragments_run_in_order(page, monkeypatch):
    """Every fragment of a page runs, in order, in one namespace: after the example the page says it continues."""
    import runpy

    monkeypatch.chdir(ROOT)
    after = RUN_AFTER.search(page.read_text())
    namespace = runpy.run_path(str((page.parent / after.group(1)).resolve())) if after else {}
    for code, reason in fragments(page):
        if reason is None:
            exec(compile(code, f"{page.name} fragment", "exec"), namespace)  # the docs' own code


def test_the_docs_run_examples():
    """The pages quote runnable examples, and each quoted file is run by some test."""
    quoted = every_quoted_example()
    assert {p.name for p in quoted} >= {
        "quickstart_decoder.py",
        "methods_tour.py",
        "custom_rule.py",
        "decoder_async.py",
    }
    for name in RUN_ELSEWHERE:
        assert ROOT / "examples" / name in quoted, f"{name} is listed as run elsewhere but no page quotes it"


def help_text(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*command.split(), "--help"])
    return out.getvalue()


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_cli_help_blocks_are_the_commands_help(page, monkeypatch):
    monkeypatch.setenv("COLUMNS", HELP_COLUMNS)
    for command, text in CLI_HELP.findall(page.read_text()):
        assert text == help_text(command), (
            f"{page.name}: the help of 'fides-rag {command}' changed; paste the output of "
            f"`COLUMNS={HELP_COLUMNS} fides-rag {command} --help` again"
        )


def test_every_subcommand_has_its_help_in_the_cli_page(monkeypatch):
    monkeypatch.setenv("COLUMNS", HELP_COLUMNS)
    documented = {command for command, _ in CLI_HELP.findall((ROOT / "docs/cli.md").read_text())}
    commands = re.search(r"\{([a-z,]+)\}", help_text("")).group(1).split(",")  # usage: fides-rag [-h] {methods,...}
    assert documented >= {""} | (set(commands) - {"methods"})


HISTORY = re.compile(r"\b(issues?|sessions?)\b|\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.IGNORECASE)


@pytest.mark.parametrize("page", READMES + DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_no_issues_sessions_or_commits(page):
    """User-facing pages describe the package as it is, not how it was developed."""
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)} names {found}"


def test_quick_starts_define_every_name_they_use():
    """Names a reader would otherwise find undefined (retriever, format_docs, index, questions, ...) are defined."""
    defined = {
        "quickstart_decoder.py": ["questions", "documents_per_question", "context_prompt", "no_context_prompt"],
        "quickstart_langchain.py": ["retriever", "format_docs", "prompt"],
        "quickstart_llamaindex.py": ["index"],
    }
    for name, names in defined.items():
        code = (ROOT / "examples" / name).read_text()
        for variable in names:
            assert re.search(rf"^(def )?{variable}\b", code, re.MULTILINE), (name, variable)
        compile(code, name, "exec")


@pytest.mark.slow
def test_decoder_quick_start_runs_and_prints_what_it_says():
    lines = run_example(ROOT / "examples/quickstart_decoder.py")
    assert len(lines) == 7, lines
    assert "Paris" in lines[0]  # the comment says: the model's memory
    assert lines[1].startswith("Rome [(' Rome', 0.43")  # the comment says: the evidence, and its alpha
    by_method = ast.literal_eval(lines[3])
    assert list(by_method) == ["standard", "cad", "fides"] and "Paris" in by_method["standard"]
    assert len(ast.literal_eval(lines[4])) == 2  # one answer per question of the batch


@pytest.mark.slow
def test_batching_quick_start_runs_and_answers_every_question():
    lines = run_example(ROOT / "examples/quickstart_batching.py")
    assert len(lines) == 3, lines
    answers = ast.literal_eval(lines[0])  # the printed list of answers, one per question
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
    assert lines[1].strip() and lines[2].strip()  # the future's answer, the streamed answer


def _chosen_by(line: str) -> list[str]:
    """The trailing list of a gated_methods.py line: who chose each token."""
    return ast.literal_eval(line[line.rindex(" [") + 1 :])


EXPECTED_OUTPUT = {
    "custom_rule.py": lambda lines: len(lines) == 1 and "{'cap': 1.0}" in lines[0],
    "decoder_async.py": lambda lines: (
        len(lines) == 3 and lines[0].split()[-1] in {"eos", "stop", "length"} and len(ast.literal_eval(lines[2])) == 3
    ),
    "gated_methods.py": lambda lines: (
        len(lines) == 10
        and all(set(_chosen_by(line)) <= {"rule", "gate"} for line in lines)
        and all(set(_chosen_by(line)) == {"rule"} for line in lines if line.strip().startswith("fides:"))
    ),
    "methods_tour.py": lambda lines: (
        len(lines) == 13
        and "decore" in ast.literal_eval(lines[0])
        and all("records:" in line for line in lines[1:12])
        and lines[12].startswith("dvd")
    ),
}
"""What each example run by test_docs_example_runs prints (its line count and the values a reader is told about)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in every_quoted_example() if p.name not in RUN_ELSEWHERE))
def test_docs_example_runs(name):
    lines = run_example(ROOT / "examples" / name)
    assert name in EXPECTED_OUTPUT, f"add what {name} prints to EXPECTED_OUTPUT"
    assert EXPECTED_OUTPUT[name](lines), "\n".join(lines)
