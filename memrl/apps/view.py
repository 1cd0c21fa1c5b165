"""`memrl view RUN_DIR`: one self-contained HTML page to watch what a memory agent keeps.

It reads every trajectories file under RUN_DIR (`memrl eval`'s `trajectories_{N}.jsonl`
and, with `eval.data`, `trajectories.jsonl`, a training run's
`val_samples/step_*.jsonl`), every run record (`run.json`, `memrl.run.record`) and every
training run's per-trajectory records (`train_trajectories/step_*.jsonl`,
`memrl.run.trajectory_log`), and writes `view.html`: no server, no network, no
external file. Given one JSONL file instead (`memrl ask ... ask.trace=FILE.jsonl`), it renders that
file into FILE.html. An episode without gold answers (`memrl ask`'s) is shown ungraded.

    runs                  at the top: each run record's key facts in one line (kind,
                          status, world size and launcher, strategy, engine and versions,
                          devices, memrl's commit, seed, config hash, start, duration), the
                          whole record folded under it
    training trajectories a table per step (the last `max_steps` steps, or those asked
                          for): question, sample, reward, advantage, conversations with
                          their tokens, mean log-prob and entropy, answer and gold
    MemAgent episode      the memory after each chunk, words added (green) and dropped (red,
                          struck) against the memory before; the gold answer highlighted, and
                          the chunks where it enters and leaves memory flagged, and the
                          chunk that completes the gold evidence (when logged); the final
                          response against the gold, with its score
    MemoryUpdate episode  every tool call with its arguments and result, the store before and
                          after (counts, added / removed / changed memories), the scores

Filters (run = the folder of the file, length = documents per question, score, category) run
in the page itself.
"""

from __future__ import annotations

import difflib
import html
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memrl.data.io import expect_object, iter_jsonl
from memrl.errors import MemrlInputError
from memrl.rewards.evidence import answer_in_text, evidence_chunk
from memrl.run.record import RUN_FILE, read_record, summary_line
from memrl.run.trajectory_files import TRAJECTORY_DIR, read_step_files

Renderer = Callable[[dict[str, Any], str], str]
"""(log row, its file relative to RUN_DIR) → the row's section of the page (HTML)."""

PATTERNS = ("trajectories*.jsonl", "val_samples/step_*.jsonl")
"""Files (under RUN_DIR, at any depth) that the viewer reads."""
_WORD = re.compile(r"\s+$|\s*\S+\s*")


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """`after` against `before`, word by word, as (op, text) pieces with op "same", "added"
    or "dropped": the "same" and "added" pieces concatenate to `after`; the words of the
    "same" and "dropped" pieces are the words of `before`."""
    a, b = _WORD.findall(before), _WORD.findall(after)
    keys_a, keys_b = [w.strip() for w in a], [w.strip() for w in b]
    out: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, keys_a, keys_b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out.append(("same", "".join(b[j1:j2])))
            continue
        if i2 > i1:
            out.append(("dropped", "".join(a[i1:i2])))
        if j2 > j1:
            out.append(("added", "".join(b[j1:j2])))
    return out


def holds_gold(memory: str, answers: Sequence[str]) -> bool:
    """Whether a gold answer occurs in the memory as whole words, both normalised as the QA
    scores normalise (`memrl.rewards.evidence.answer_in_text`; never for yes / no)."""
    return bool(answer_in_text(memory, answers))


def gold_events(memories: Sequence[str], answers: Sequence[str]) -> list[str]:
    """Per chunk: "enters" (gold now in memory, not before), "leaves", "kept" or ""."""
    out, had = [], False
    for memory in memories:
        has = holds_gold(memory, answers)
        out.append("enters" if has and not had else "leaves" if had and not has
                   else "kept" if has else "")
        had = has
    return out


def _mark_gold(text: str, answers: Sequence[str]) -> str:
    """`text` escaped, with every gold answer occurrence in <mark class="gold">."""
    golds = sorted({a for a in answers if a.strip()}, key=len, reverse=True)
    if not golds:
        return html.escape(text)
    pattern = re.compile("|".join(re.escape(g) for g in golds), re.IGNORECASE)
    out, last = [], 0
    for m in pattern.finditer(text):
        out += [html.escape(text[last:m.start()]),
                f'<mark class="gold">{html.escape(m.group(0))}</mark>']
        last = m.end()
    return "".join(out) + html.escape(text[last:])


def _score(row: dict[str, Any]) -> float:
    scores = row.get("scores") or {}
    for key in ("sub_em", "llm_judge", "f1", "em"):
        if isinstance(scores.get(key), int | float):
            return float(scores[key])
    reward = row.get("reward")
    return float(reward) if isinstance(reward, int | float) else 0.0


def _strs(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def render_memagent(row: dict[str, Any], source: str) -> str:
    answers, memories = _strs(row.get("answers")), _strs(row.get("memories"))
    events = gold_events(memories, answers)
    evidence_at = evidence_chunk(row.get("evidence"))
    steps, before = [], "No previous memory"
    for k, (memory, event) in enumerate(zip(memories, events, strict=True)):
        pieces = []
        for op, text in word_diff(before, memory):
            body = _mark_gold(text, answers)
            pieces.append(body if op == "same" else
                          f'<ins class="added">{body}</ins>' if op == "added" else
                          f'<del class="dropped">{body}</del>')
        flag = {"enters": '<span class="flag enters">gold enters</span>',
                "leaves": '<span class="flag leaves">gold leaves</span>'}.get(event, "")
        if k == evidence_at:
            flag += '<span class="flag evidence">evidence read</span>'
        steps.append(f'<li class="chunk {event}"><span class="k">chunk {k + 1}</span>{flag}'
                     f'<div class="memory">{"".join(pieces) or "<i>(empty)</i>"}</div></li>')
        before = memory
    score = _score(row)
    return (
        _header(row, source, score, "memagent")
        + f'<ol class="chunks">{"".join(steps)}</ol>'
        + '<div class="final"><b>final response:</b> '
        + f'<span class="response">{_mark_gold(str(row.get("final_response", "")), answers)}'
        + f'</span><br><b>answer:</b> <code class="answer">{html.escape(str(row.get("answer")))}'
        + f'</code> <b>gold:</b> <code class="gold-answer">{html.escape(" | ".join(answers))}'
        + f'</code> <b>score:</b> <span class="score">{score:g}</span></div></section>'
    )


def render_memupdate(row: dict[str, Any], source: str) -> str:
    calls = [c for c in row.get("calls") or [] if isinstance(c, dict)]
    items = "".join(
        f'<li class="call {"ok" if c.get("ok") else "failed"}">'
        f'<code>{html.escape(str(c.get("name")))}'
        f'({html.escape(json.dumps(c.get("arguments"), ensure_ascii=False))})</code> → '
        f'<span class="result">{html.escape(str(c.get("result", "")))}</span></li>'
        for c in calls
    )
    diff = row.get("memory_diff") or {}
    added = "".join(f'<li><ins class="added">{html.escape(str(m.get("text")))}</ins></li>'
                    for m in diff.get("added_texts") or [])
    removed = "".join(f'<li><del class="dropped">{html.escape(str(m.get("text")))}</del></li>'
                      for m in diff.get("removed_texts") or [])
    changed = "".join(
        f'<li><del class="dropped">{html.escape(str(m.get("before")))}</del> → '
        f'<ins class="added">{html.escape(str(m.get("after")))}</ins></li>'
        for m in diff.get("changed_texts") or []
    )
    store = lambda key: html.escape(json.dumps(row.get(key), ensure_ascii=False))  # noqa: E731
    score = _score(row)
    return (
        _header(row, source, score, "memupdate")
        + f'<h4>tool calls ({len(calls)})</h4><ol class="calls">{items}</ol>'
        + f'<div class="store"><b>store before:</b> {store("memory_before")} '
        + f'<b>after:</b> {store("memory_after")}</div>'
        + f'<ul class="diff">{added}{removed}{changed}</ul>'
        + '<div class="final"><b>gold:</b> <code class="gold-answer">'
        + f'{html.escape(" | ".join(_strs(row.get("answers"))))}</code> '
        + f'<b>scores:</b> {html.escape(json.dumps(row.get("scores")))} '
        + f'<b>score:</b> <span class="score">{score:g}</span></div></section>'
    )


def _header(row: dict[str, Any], source: str, score: float, kind: str) -> str:
    length = row.get("num_docs") or row.get("num_chunks") or 0
    category = row.get("category", "")
    attrs = (f'data-length="{html.escape(str(length))}" data-score="{score:g}" '
             f'data-category="{html.escape(str(category))}" data-kind="{kind}" '
             f'data-run="{html.escape(_run_of(source))}"')
    verdict = ("ungraded" if not row.get("answers") else "correct" if score >= 1
               else "partial" if score > 0 else "wrong")
    return (
        f'<section class="episode {verdict}" {attrs}><h3>{html.escape(str(row.get("id")))}'
        f' <small>{html.escape(source)} · length {html.escape(str(length))}'
        + (f" · category {html.escape(str(category))}" if category != "" else "")
        + f'</small></h3><p class="question">{html.escape(str(row.get("question", "")))}</p>'
    )


def _run_of(source: str) -> str:
    """The folder of a trajectories file (relative to RUN_DIR): which evaluation or run."""
    parent = str(Path(source).parent)
    return "." if parent in ("", ".") else parent


def find_trajectory_files(run_dir: Path) -> list[Path]:
    files = {p for pattern in PATTERNS for p in run_dir.rglob(pattern) if p.is_file()}
    return sorted(files)


def find_run_records(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(folder relative to RUN_DIR, record) of every run.json under RUN_DIR."""
    out = []
    for path in sorted(run_dir.rglob(RUN_FILE)):
        record = read_record(path)
        if record is not None:
            out.append((_run_of(str(path.relative_to(run_dir))), record))
    return out


def render_runs(records: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The runs section: one line of key facts per record, the whole record folded."""
    if not records:
        return ""
    items = []
    for folder, record in records:
        full = {k: v for k, v in record.items() if k != "previous"}
        earlier = len(record.get("previous") or [])
        items.append(
            f'<li class="run {html.escape(str(record.get("status", "")))}">'
            f'<details><summary><code>{html.escape(folder)}</code> '
            f'{html.escape(summary_line(record))}'
            + (f" · {earlier} earlier run(s) here" if earlier else "")
            + f'</summary><pre>{html.escape(json.dumps(full, indent=2, ensure_ascii=False))}'
            '</pre></details></li>')
    return f'<section class="runs"><h2>runs</h2><ul>{"".join(items)}</ul></section>'


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def render_training_step(step: int, rows: Sequence[dict[str, Any]], *,
                         unfold: bool = False) -> str:
    """One step's trajectories as a table (a row per trajectory, by group); `unfold`: shown
    open."""
    body = []
    for row in rows:
        convs = [c for c in row.get("conversations") or [] if isinstance(c, dict)]
        conv = " ".join(
            f'<span title="prompt {html.escape(str(c.get("prompt_tokens")))} tokens'
            f'{", truncated" if c.get("truncated") else ""}">'
            f'{html.escape(str(c.get("kind")))}:{html.escape(str(c.get("response_tokens")))}'
            f'{"✂" if c.get("truncated") else ""}</span>' for c in convs)
        body.append(
            "<tr>" + "".join(f"<td>{cell}</td>" for cell in (
                html.escape(str(row.get("id"))), html.escape(str(row.get("sample_index"))),
                _num(row.get("reward")), _num(row.get("advantage"), 4),
                html.escape(str(row.get("num_conversations"))), conv,
                _num(row.get("logprob_mean")), _num(row.get("entropy_mean")),
                f'<code>{html.escape(str(row.get("answer")))}</code>',
                html.escape(" | ".join(_strs(row.get("gold")))),
            )) + "</tr>")
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), int | float)]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    head = "".join(f"<th>{c}</th>" for c in (
        "question", "sample", "reward", "advantage", "conv.", "response tokens per conversation",
        "log-prob", "entropy", "answer", "gold"))
    return (f'<details class="step" data-step="{step}"{" open" if unfold else ""}>'
            f'<summary>step {step} · {len(rows)} '
            f'trajectories · {len({r.get("id") for r in rows})} groups · reward mean '
            f'{mean:.3f}</summary><table><thead><tr>{head}</tr></thead><tbody>'
            f'{"".join(body)}</tbody></table></details>')


def render_training(run_dir: Path, steps: Sequence[int] | None = None,
                    max_steps: int = 50) -> str:
    """The training-trajectories sections of every training run under RUN_DIR: the steps
    asked for, else the last `max_steps`."""
    sections = []
    for folder in sorted(p.parent for p in run_dir.rglob(TRAJECTORY_DIR) if p.is_dir()):
        by_step = read_step_files(folder)
        if not by_step:
            continue
        chosen = ([s for s in steps if s in by_step] if steps
                  else sorted(by_step)[-max_steps:])
        note = "" if len(chosen) == len(by_step) else (
            f" (steps {', '.join(map(str, chosen))} of {len(by_step)} logged; "
            "<code>--step N</code> shows another)")
        rel = _run_of(str((folder / TRAJECTORY_DIR).relative_to(run_dir)))
        sections.append(
            f'<section class="training"><h2>training trajectories · '
            f'<code>{html.escape(rel)}</code>{note}</h2>'
            + "".join(render_training_step(s, by_step[s], unfold=s == chosen[-1])
                      for s in chosen) + "</section>")
    return "".join(sections)


def render_generic(row: dict[str, Any], source: str) -> str:
    """Any task's log row: its question, answer and scores, and the whole row folded."""
    score = _score(row)
    whole = html.escape(json.dumps(row, indent=2, ensure_ascii=False, default=str))
    return (
        _header(row, source, score, "task")
        + '<div class="final"><b>answer:</b> <code class="answer">'
        + f'{html.escape(str(row.get("answer")))}</code> <b>gold:</b> <code class="gold-answer">'
        + f'{html.escape(" | ".join(_strs(row.get("answers"))))}</code> <b>scores:</b> '
        + f'{html.escape(json.dumps(row.get("scores"), default=str))} <b>reward:</b> '
        + f'{_num(row.get("reward"))}</div><details><summary>row</summary><pre>{whole}</pre>'
        + '</details></section>'
    )


RENDERERS: dict[str, Renderer] = {"memagent": render_memagent, "memupdate": render_memupdate}
"""The page section of a log row, by task name. A task class of another name may define
`render_row(row, source) -> str` (HTML, `memrl.tasks.RendersRows`); without one its rows get
`render_generic`."""

BENCHMARK_AGENTS = {"ruler_hqa": "memagent", "locomo": "memupdate"}
"""The agent of results.json files that name only their benchmark."""


def agent_of(path: Path) -> str | None:
    """The agent that wrote the trajectories file `path`: its run's `results.json`
    (`agent`, else its benchmark) or training `config.yaml` (`agent`), in its folder or the
    one above (val_samples/); None when neither says (a `memrl ask` trace: MemAgent)."""
    import yaml

    for folder in (path.parent, path.parent.parent):
        try:
            if (folder / "results.json").is_file():
                results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
                return results.get("agent") or BENCHMARK_AGENTS.get(results.get("benchmark"))
            if (folder / "config.yaml").is_file():
                config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
                return config.get("agent", "memagent") if isinstance(config, dict) else None
        except (OSError, ValueError, yaml.YAMLError, AttributeError):
            return None
    return None


def renderer_for(agent: str | None) -> Renderer:
    """The renderer of an agent's rows: its task's `render_row`, else `RENDERERS` by the
    task's name, else `render_generic` (also for an agent that cannot be imported here)."""
    if agent is None:
        return render_memagent
    from memrl.tasks import RendersRows, task_class

    try:
        cls = task_class(agent)
    except MemrlInputError:
        return render_generic
    if issubclass(cls, RendersRows):  # a static method render_row(row, source)
        return cls.render_row
    return RENDERERS.get(cls.name, render_generic)


def render_page(episodes: list[tuple[str, dict[str, Any]]], title: str, *,
                header: str = "", agents: dict[str, str | None] | None = None) -> str:
    """The whole page for (source, row) episodes, each rendered by the renderer of the agent
    that wrote its source (`agents`: source → agent; a source not in it: MemAgent's);
    `header` (runs, training trajectories) goes above them."""
    agents = agents or {}
    renderers = {src: renderer_for(agents.get(src)) for src in dict.fromkeys(s for s, _ in
                                                                             episodes)}
    sections = [renderers[src](row, src) for src, row in episodes]
    lengths = sorted({str(r.get("num_docs") or r.get("num_chunks") or 0) for _, r in episodes},
                     key=lambda v: (len(v), v))
    categories = sorted({str(r["category"]) for _, r in episodes if "category" in r})
    runs = sorted({_run_of(src) for src, _ in episodes})
    option = lambda v: f'<option value="{html.escape(v)}">{html.escape(v)}</option>'  # noqa: E731
    return _PAGE.format(
        title=html.escape(title), count=len(sections),
        lengths="".join(option(v) for v in lengths),
        categories="".join(option(v) for v in categories),
        runs="".join(option(v) for v in runs),
        body="\n".join(sections), header=header,
    )


def write_view(run_dir: str | Path, out: str | Path | None = None, *,
               steps: Sequence[int] | None = None, max_steps: int = 50) -> Path:
    """Write RUN_DIR/view.html (or `out`) from every trajectories file, run record and
    training run's trajectory records under RUN_DIR (training steps: `steps`, else the last
    `max_steps`); or, given one JSONL file, FILE.html (or `out`) from it."""
    run = Path(run_dir)
    if run.is_file():
        files, root, default, header = [run], run.parent, run.with_suffix(".html"), ""
    elif run.is_dir():
        files, root, default = find_trajectory_files(run), run, run / "view.html"
        header = render_runs(find_run_records(run)) + render_training(run, steps, max_steps)
    else:
        raise MemrlInputError("no such directory or file", location=str(run))
    if not files and not header:
        raise MemrlInputError(
            "no trajectories file under it (trajectories*.jsonl, val_samples/step_*.jsonl, "
            f"{TRAJECTORY_DIR}/step_*.jsonl) and no {RUN_FILE}", location=str(run))
    episodes, agents = [], {}
    for path in files:
        source = str(path.relative_to(root))
        agents[source] = agent_of(path)
        for line, value in iter_jsonl(path):
            row = dict(expect_object(value, f"{path}:{line}", "trajectory"))
            episodes.append((source, row))
    target = Path(out) if out is not None else default
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_page(episodes, f"memrl view · {run}", header=header,
                                  agents=agents), encoding="utf-8")
    return target


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; }}
.episode {{ border: 1px solid #ccc; border-radius: 6px; padding: .6em 1em; margin: 1em 0; }}
.episode.correct {{ border-left: 6px solid #2a2; }}
.episode.wrong {{ border-left: 6px solid #c33; }}
.episode.partial {{ border-left: 6px solid #d90; }}
.episode.ungraded {{ border-left: 6px solid #999; }}
h3 small {{ color: #777; font-weight: normal; }}
ins.added {{ background: #d4f7d4; text-decoration: none; }}
del.dropped {{ background: #fbd4d4; color: #a33; }}
mark.gold {{ background: #ffe066; font-weight: bold; }}
.flag {{ font-size: 11px; padding: 0 .4em; border-radius: 3px; margin-left: .5em; }}
.flag.enters {{ background: #2a2; color: white; }}
.flag.leaves {{ background: #c33; color: white; }}
.flag.evidence {{ background: #36c; color: white; }}
.chunk .k {{ color: #777; font-size: 12px; }} .memory {{ white-space: pre-wrap; }}
.call.failed {{ color: #a33; }} .hidden {{ display: none; }}
.runs li {{ list-style: none; margin: .2em 0; }} .runs pre {{ font-size: 12px; }}
.run.error summary, .run.unfinished summary {{ color: #a33; }}
.run.interrupted summary {{ color: #b70; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ddd; padding: .15em .4em; text-align: left; }}
details.step {{ margin: .3em 0; }}
</style></head><body>
<h1>{title}</h1>
{header}
<form id="filters">run <select id="f-run"><option value="">all</option>{runs}</select>
length <select id="f-length"><option value="">all</option>{lengths}</select>
score <select id="f-score"><option value="">all</option><option value="correct">correct</option>
<option value="wrong">not correct</option></select>
category <select id="f-category"><option value="">all</option>{categories}</select>
<span id="shown">{count}</span> / {count} episodes</form>
{body}
<script>
(function () {{
  var episodes = Array.prototype.slice.call(document.querySelectorAll(".episode"));
  function apply() {{
    var len = document.getElementById("f-length").value;
    var score = document.getElementById("f-score").value;
    var cat = document.getElementById("f-category").value;
    var run = document.getElementById("f-run").value;
    var shown = 0;
    episodes.forEach(function (e) {{
      var s = parseFloat(e.dataset.score);
      var ok = (!len || e.dataset.length === len) && (!cat || e.dataset.category === cat) &&
        (!run || e.dataset.run === run) &&
        (!score || (score === "correct" ? s >= 1 : s < 1));
      e.classList.toggle("hidden", !ok);
      if (ok) shown += 1;
    }});
    document.getElementById("shown").textContent = String(shown);
  }}
  ["f-run", "f-length", "f-score", "f-category"].forEach(function (id) {{
    document.getElementById(id).addEventListener("change", apply);
  }});
  apply();
}})();
</script></body></html>
"""
