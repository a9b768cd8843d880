"""lm-eval's results read generically: every task, every metric, with its stderr.

lm-eval 0.4.13 reports ``out["results"][task]`` as ``{"alias": ..., "sample_len": ..., "METRIC,
FILTER": value, "METRIC_stderr,FILTER": stderr or "N/A"}`` (``evaluator_utils.py``), and the
same for ``out["groups"]``. Its RULER tasks name one metric per length (``"4096"``: mean
``string_match_all``, a fraction) and write ``-1`` for a length without documents
(``ruler/common_utils.py:aggregate_metrics``), including ``"4096"`` whenever it was not asked for;
those sentinels of unrequested lengths are dropped, a requested length without a score is an
error. A task with no metric at all is an error naming it: nothing asked for is dropped.
"""

from __future__ import annotations

from typing import Any

from megatron_endprompt.errors import UserError

__all__ = ["RULER_TASKS", "read_metrics", "read_results", "sample_records"]

#: lm-eval 0.4.13's 13 RULER tasks (group ``ruler``, ``tasks/ruler/ruler.yaml``).
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
               "niah_multikey_2", "niah_multikey_3", "niah_multiquery", "niah_multivalue",
               "ruler_vt", "ruler_cwe", "ruler_fwe", "ruler_qa_squad", "ruler_qa_hotpot")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def read_metrics(entry: dict[str, Any], *, lengths: list[int]) -> dict[str, dict[str, Any]]:
    """``{"METRIC" (or "METRIC,FILTER" when the filter is not ``none``): {"value", "stderr",
    "filter"}}`` of one lm-eval results entry; RULER's ``-1`` for unrequested lengths dropped."""
    values: dict[tuple[str, str], float] = {}
    errors: dict[tuple[str, str], float | None] = {}
    for key, raw in entry.items():
        if "," not in key:
            continue  # alias, name, sample_len
        metric, filt = key.split(",", 1)
        if metric.endswith("_stderr"):
            errors[(metric[: -len("_stderr")], filt)] = _number(raw)
        elif (v := _number(raw)) is not None:
            if metric.isdigit() and int(metric) not in lengths and v == -1:
                continue
            values[(metric, filt)] = v
    return {(m if f == "none" else f"{m},{f}"): {"value": v, "stderr": errors.get((m, f)),
                                                 "filter": f}
            for (m, f), v in values.items()}


def read_results(out: dict[str, Any], *, leaves: list[str],
                 lengths: list[int]) -> dict[str, Any]:
    """Our ``{"tasks", "groups", "ruler"}`` of lm-eval's ``simple_evaluate`` output.

    ``tasks[t]``: ``metrics`` (lm-eval's values, as it reports them), ``scores`` (per requested
    length in percent, for tasks with length metrics: RULER), ``samples`` (documents run).
    ``ruler``: the per-length average of the RULER tasks' scores, as the native backend's."""
    tasks: dict[str, Any] = {}
    for name in leaves:
        entry = out["results"].get(name)
        metrics = read_metrics(entry, lengths=lengths) if entry else {}
        if not metrics:
            raise UserError(f"--tasks {name}: lm-eval ran the task but it yielded no metric; "
                            "check the task's metric_list (or process_results)")
        by_length = {str(n): metrics.get(str(n)) for n in lengths}
        scored = any(m is not None for m in by_length.values())
        if scored:
            empty = [n for n, m in by_length.items() if m is None or m["value"] == -1]
            if empty:
                raise UserError(f"--tasks {name}: lm-eval reported no score at length(s) "
                                f"{','.join(empty)}; give --lengths the task can fill")
        n_samples = (out.get("n-samples") or {}).get(name, {})
        tasks[name] = {
            "ruler": name in RULER_TASKS, "exact_ruler": name in RULER_TASKS,
            "haystack": None, "metrics": metrics,
            "scores": {n: round(100 * m["value"], 2) for n, m in by_length.items()} if scored
            else {},
            "samples": n_samples.get("effective", entry.get("sample_len")),
        }
    groups = {}
    for name, entry in (out.get("groups") or {}).items():
        metrics = read_metrics(entry, lengths=lengths)
        if metrics:
            groups[name] = {"metrics": metrics}
    scored_tasks = [t for t in tasks if tasks[t]["scores"]]
    result: dict[str, Any] = {"tasks": tasks}
    if groups:
        result["groups"] = groups
    if scored_tasks:
        avg = {str(n): round(sum(tasks[t]["scores"][str(n)] for t in scored_tasks)
                             / len(scored_tasks), 2) for n in lengths}
        result["ruler"] = {
            "tasks_run": scored_tasks, "exact_ruler_tasks": scored_tasks,
            "substitute_haystack_tasks": [], "average": avg,
            "average_over_lengths": round(sum(avg.values()) / len(avg), 2),
            "note": "average of lm-eval's RULER task scores (string_match x 100) over the "
                    "tasks run; comparable to published RULER tables only over the same tasks"}
    return result


def sample_records(out: dict[str, Any]) -> list[dict[str, Any]]:
    """lm-eval's per-sample log (``simple_evaluate(log_samples=True)``: ``out["samples"]``) as
    one flat record per document: ``task``, ``doc_id``, ``prompt`` (the context the model got,
    shots and chat template included), ``continuations`` (multiple choice: the choices scored),
    ``target``, ``output`` (the filtered responses: generated text, or per-choice
    ``[loglikelihood, is_greedy]``), ``raw_output`` (lm-eval's ``resps``: the responses before
    the filters), ``filter`` and the document's metric values. An empty generation and a
    wrong-format one both filter to ``[invalid]``; their raw outputs tell them apart."""
    records = []
    for task, examples in (out.get("samples") or {}).items():
        for ex in examples:
            args = ex.get("arguments") or []
            first = args[0] if args else ()
            rec = {"task": task, "doc_id": ex.get("doc_id"),
                   "prompt": first[0] if first else None, "target": ex.get("target"),
                   "output": ex.get("filtered_resps"), "raw_output": ex.get("resps"),
                   "filter": ex.get("filter")}
            if len(args) > 1 and all(len(a) == 2 and isinstance(a[1], str) for a in args):
                rec["continuations"] = [a[1] for a in args]
            rec.update({m: ex.get(m) for m in ex.get("metrics", [])})
            records.append(rec)
    return records
